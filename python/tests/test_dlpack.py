"""DLPack and NumPy interop: zero-copy both ways (same data pointer), strides, lifetimes."""
import gc
import sys
import types

import numpy as np
import pytest

import kiln
from conftest import requires_cuda


def ptr(a):
    return a.__array_interface__["data"][0]


def test_numpy_view_is_zero_copy():
    t = kiln.randn(3, 4)
    a = t.numpy()
    assert ptr(a) == t.data_ptr() and a.dtype == np.float32 and a.shape == (3, 4)
    a[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    s = t.t().numpy()  # strided view keeps strides
    assert ptr(s) == t.data_ptr() and s.strides == (4, 16)


def test_numpy_view_keeps_storage_alive():
    a = kiln.arange(10, dtype=kiln.float64).numpy()
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(10))


@pytest.mark.parametrize("np_dtype,kdtype", [(np.float32, kiln.float32), (np.float64, kiln.float64),
                                             (np.float16, kiln.float16), (np.int64, kiln.int64),
                                             (np.int32, kiln.int32), (np.int8, kiln.int8), (np.uint8, kiln.uint8),
                                             (np.bool_, kiln.bool)])
def test_numpy_round_trip_dtypes(np_dtype, kdtype):
    a = (np.arange(12).reshape(3, 4) % 3).astype(np_dtype)
    t = kiln.from_dlpack(a)
    assert t.dtype is kdtype and t.shape == (3, 4) and t.data_ptr() == ptr(a)
    b = t.numpy()
    assert b.dtype == np_dtype and ptr(b) == ptr(a)
    np.testing.assert_array_equal(b, a)
    c = np.from_dlpack(t)
    assert ptr(c) == ptr(a)


def test_from_numpy_shares_writes_and_lifetime():
    a = np.zeros((4, 5), np.float32)
    t = kiln.from_numpy(a)
    t += 1
    assert (a == 1).all()
    b = np.ones((2, 3))
    t2 = kiln.from_numpy(b[:, ::2])  # strided
    assert t2.stride() == (3, 2) and t2.data_ptr() == ptr(b)
    del b
    gc.collect()
    assert t2.sum().item() == 4.0


def test_numpy_readonly_is_copied():
    a = np.arange(4.0)
    a.setflags(write=False)
    t = kiln.from_dlpack(a)
    assert t.data_ptr() != ptr(a)  # kiln has no read-only tensors: a private copy
    np.testing.assert_array_equal(t.numpy(), a)


def test_negative_strides_raise():
    with pytest.raises((kiln.KilnError, BufferError)):
        kiln.from_dlpack(np.arange(5.0)[::-1])


def test_bfloat16_numpy_without_ml_dtypes_raises_type_error(monkeypatch):
    t = kiln.tensor([1.0, 2.5], dtype=kiln.bfloat16)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # makes `import ml_dtypes` raise ImportError
    with pytest.raises(TypeError, match=r"BFloat16.*\.float\(\)\.numpy\(\).*ml_dtypes"):
        t.numpy()
    with pytest.raises(TypeError, match="ml_dtypes"):
        np.asarray(t)
    assert t.float().numpy().tolist() == [1.0, 2.5] and t.tolist() == [1.0, 2.5]  # the suggested ways work


def test_bfloat16_numpy_with_ml_dtypes(monkeypatch):
    t = kiln.tensor([1.0, 2.5, -3.0], dtype=kiln.bfloat16)
    # The path itself, with a stand-in module (runs even where ml_dtypes is not installed).
    fake = types.ModuleType("ml_dtypes")
    fake.bfloat16 = np.dtype("<u2")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "ml_dtypes", fake)
        a = t.numpy()
        assert a.dtype == np.dtype("<u2") and ptr(a) == t.data_ptr()
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed: real bfloat16 arrays untested")
    a = t.numpy()
    assert a.dtype == ml_dtypes.bfloat16 and ptr(a) == t.data_ptr()
    np.testing.assert_array_equal(a.astype(np.float32), [1.0, 2.5, -3.0])
    a[0] = 4.0  # a view: writes reach the tensor
    assert t.tolist()[0] == 4.0


@pytest.mark.skipif(kiln.cuda.is_available(), reason="checks the error of a build / machine without CUDA")
def test_cuda_producer_without_cuda_raises():
    class FakeCudaArray:  # claims to live on cuda:0
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("kiln must refuse before asking for the capsule")

    with pytest.raises(kiln.KilnError, match=r"\[from_dlpack\] a CUDA tensor.*without CUDA"):
        kiln.from_dlpack(FakeCudaArray())


def test_capsule_consumed_once():
    t = kiln.ones(3)
    cap = t.__dlpack__()
    k = kiln.from_dlpack(cap)
    assert k.data_ptr() == t.data_ptr()
    with pytest.raises(kiln.KilnError, match="consumed"):
        kiln.from_dlpack(cap)
    assert t.__dlpack_device__() == (1, 0)


def test_unconsumed_capsules_are_freed():
    gc.collect()  # garbage of earlier tests (e.g. tensors held by exception tracebacks) first
    before = kiln.cpu.memory_allocated()
    for _ in range(10):
        kiln.ones(1000).__dlpack__()
        kiln.ones(1000).__dlpack__(max_version=(1, 0))
    gc.collect()
    assert kiln.cpu.memory_allocated() == before


# ---- torch ----

def test_torch_round_trip_zero_copy():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 6)
    k = kiln.from_dlpack(x)
    assert k.data_ptr() == x.data_ptr() and k.dtype is kiln.float32
    back = torch.from_dlpack(k)
    assert back.data_ptr() == x.data_ptr()
    k.mul_(2.0)
    assert torch.equal(x, back)
    xt = x.t()
    kt = kiln.from_dlpack(xt)
    assert kt.stride() == xt.stride() and kt.data_ptr() == xt.data_ptr()
    y = torch.from_dlpack(kiln.arange(12).view(3, 4).t())
    assert y.stride() == (1, 4) and y.tolist() == torch.arange(12).view(3, 4).t().tolist()


@pytest.mark.parametrize("name", ["float32", "float64", "bfloat16", "float16", "int64", "int32", "int8", "uint8", "bool"])
def test_torch_dtypes(name):
    torch = pytest.importorskip("torch")
    x = (torch.arange(6) % 2).to(getattr(torch, name))
    k = kiln.from_dlpack(x)
    assert k.dtype.name == name and k.data_ptr() == x.data_ptr()
    y = torch.from_dlpack(k)
    assert y.dtype == x.dtype and torch.equal(x, y)
    assert kiln.zeros(2, dtype=getattr(torch, name)).dtype.name == name  # torch dtypes are accepted


def test_torch_keeps_kiln_memory_alive():
    torch = pytest.importorskip("torch")
    y = torch.from_dlpack(kiln.full((1000,), 3.0))
    gc.collect()
    assert y.sum().item() == 3000.0


# ---- CUDA ----

@requires_cuda
def test_cuda_dlpack_torch_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.randn(256, 64, device="cuda")
    k = kiln.from_dlpack(x)
    assert k.device == kiln.device("cuda:0") and k.data_ptr() == x.data_ptr()
    y = torch.from_dlpack(k * 2)
    assert y.device.type == "cuda"
    torch.testing.assert_close(y, x * 2)
    back = torch.from_dlpack(k)
    assert back.data_ptr() == x.data_ptr()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # a consumer on a side stream waits for kiln's stream
        z = torch.from_dlpack(kiln.from_dlpack(x) + 1)
        torch.testing.assert_close(z, x + 1)


@requires_cuda
def test_cuda_numpy_raises():
    with pytest.raises(kiln.KilnError, match="cpu"):
        kiln.ones(2, device="cuda").numpy()
