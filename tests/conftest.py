import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the shared case modules beside the tests

import uform  # noqa: E402


def pytest_generate_tests(metafunc):
    """`device` runs each test on the CPU, and on GPU 0 too when the engine has one."""
    if "device" in metafunc.fixturenames:
        params = ["cpu"] + (["gpu"] if uform.gpu_count() > 0 else [])
        metafunc.parametrize("device", params, indirect=True)


@pytest.fixture
def device(request):
    return uform.Device.cpu() if request.param == "cpu" else uform.Device.gpu(0)
