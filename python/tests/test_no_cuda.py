"""Asking for CUDA where there is no GPU or driver: a RuntimeError that says so, raised at once
(not "CUDA driver version is insufficient"). Runs only on machines without a usable GPU."""
import pytest

import kiln

pytestmark = pytest.mark.skipif(kiln.cuda.is_available(), reason="a GPU is present")

NO_DEVICE = "no CUDA device: this machine has no NVIDIA driver / GPU"


def _no_driver_here():
    import os
    return not os.path.exists("/proc/driver/nvidia/version")


@pytest.fixture(autouse=True)
def _needs_no_driver():
    if not _no_driver_here():
        pytest.skip("an NVIDIA driver is loaded (the message then names the build or the driver version)")


def test_to_cuda_says_there_is_no_device():
    x = kiln.randn(2, 3)
    with pytest.raises(RuntimeError, match=NO_DEVICE):
        x.to("cuda")
    with pytest.raises(RuntimeError, match=NO_DEVICE):
        x.cuda()


def test_factories_on_cuda_say_there_is_no_device():
    with pytest.raises(RuntimeError, match=NO_DEVICE):
        kiln.zeros(4, device="cuda")


def test_memory_statistics_say_there_is_no_device():
    for call in (lambda: kiln.cuda.memory_allocated(), lambda: kiln.cuda.memory_allocated("cuda:0"),
                 lambda: kiln.cuda.max_memory_allocated(0), lambda: kiln.cuda.reset_peak_memory_stats("cuda"),
                 lambda: kiln.cuda.synchronize()):
        with pytest.raises(RuntimeError, match=NO_DEVICE):
            call()


def test_is_available_and_device_count_stay_quiet():
    assert kiln.cuda.is_available() is False
    assert kiln.cuda.device_count() == 0
