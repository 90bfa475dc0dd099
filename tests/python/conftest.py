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


@pytest.fixture(scope="session")
def ckplan(request):
    import ckplan_torch
    return ckplan_torch.find_ckplan(request.config.getoption("--ckplan"))
