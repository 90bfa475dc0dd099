"""Assertions for the Python tests: each check prints ok/FAILED, and the run
ends with the 'N passed, N failed' line that CI reads."""

_failures = []
_passed = [0]


def check(condition, what):
    if condition:
        _passed[0] += 1
        print(f"ok: {what}")
    else:
        _failures.append(what)
        print(f"FAILED: {what}")


def finish():
    """Prints the summary; returns the exit code: 1 when a check failed, or when none ran (a run that
    checked nothing has not passed)."""
    print(f"{_passed[0]} passed, {len(_failures)} failed")
    if not _failures and not _passed[0]:
        print("FAILED: no check ran")
    code = 1 if _failures or not _passed[0] else 0
    _failures.clear()  # the next script run in the same process (pytest) starts afresh
    _passed[0] = 0
    return code
