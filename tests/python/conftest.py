"""pytest set-up for the Python tests: `--ckplan PATH` (the binary; default:
what ckplan_torch.find_ckplan finds: the installed one after `pip install`)
and the import paths: the checkout's ckplan_torch unless one is installed."""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("ckplan_torch") is None:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
sys.path.insert(0, HERE)


def pytest_addoption(parser):
    parser.addoption("--ckplan", default=None, help="the ckplan binary (default: installed, $CKPLAN or build/ckplan)")
    parser.addoption("--models", default=None, help="the test models' folder (build/test_models)")
    parser.addoption("--planner-tests", default=None, help="the planner_tests program (build/tests/planner_tests)")
    parser.addoption("--profile", default=None, help="a profile for the report tests (data/example.profile.json)")


@pytest.fixture(scope="session")
def ckplan(request):
    import ckplan_torch
    return ckplan_torch.find_ckplan(request.config.getoption("--ckplan"))


def _given(request, option):
    """The value of a command-line option the test needs; the test is skipped without it (ctest passes it)."""
    value = request.config.getoption(option)
    if value is None:
        pytest.skip(f"needs {option} (ctest passes it)")
    return value


@pytest.fixture(scope="session")
def models_dir(request):
    """The test models' folder (--models)."""
    return _given(request, "--models")


@pytest.fixture(scope="session")
def profile(request):
    """The profile the report tests make their reports of (--profile)."""
    return _given(request, "--profile")


@pytest.fixture(scope="session")
def planner_tests(request):
    """The planner_tests program (--planner-tests)."""
    return _given(request, "--planner-tests")


def _one_thread():
    """One thread while the fixture lasts, as ckplan profiles on the CPU: more threads hold per-thread
    buffers."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread_module():
    """One thread for a whole module whose module-scoped fixtures measure (use with pytestmark)."""
    yield from _one_thread()


@pytest.fixture
def one_thread():
    """One thread for a test that measures a step's memory."""
    yield from _one_thread()
