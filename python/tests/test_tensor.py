"""kiln.Tensor basics: factories, dtype/device objects, views, indexing, conversions, errors."""
import pickle

import numpy as np
import pytest

import kiln
from conftest import rel_error


def test_dtype_objects():
    assert kiln.float32 is kiln.float and kiln.int64 is kiln.long
    assert repr(kiln.bfloat16) == "kiln.bfloat16"
    assert kiln.bfloat16.itemsize == 2 and kiln.bfloat16.is_floating_point
    assert not kiln.int32.is_floating_point
    assert pickle.loads(pickle.dumps(kiln.float16)) is kiln.float16
    assert kiln.zeros(2, dtype=kiln.bfloat16).dtype is kiln.bfloat16
    assert kiln.zeros(2, dtype="float64").dtype is kiln.float64


def test_device_objects():
    d = kiln.device("cpu")
    assert d == "cpu" and str(d) == "cpu" and d.index is None
    assert kiln.device("cuda:1") == kiln.device("cuda", 1)
    assert repr(kiln.device("cuda:1")) == "device(type='cuda', index=1)"
    assert kiln.zeros(1).device == kiln.device("cpu")
    with pytest.raises(kiln.KilnError):
        kiln.device("tpu")


@pytest.mark.parametrize("shape_args", [(2, 3), ((2, 3),), ([2, 3],)])
def test_factories_shapes(shape_args):
    for f in (kiln.zeros, kiln.ones, kiln.empty, kiln.rand, kiln.randn):
        t = f(*shape_args)
        assert t.shape == (2, 3) and t.ndim == 2 and t.numel() == 6 and t.dtype is kiln.float32
    assert kiln.zeros(()).shape == () and kiln.zeros(()).numel() == 1


def test_factories_values():
    np.testing.assert_array_equal(kiln.zeros(2, 3).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(kiln.ones(4, dtype=kiln.int32).numpy(), np.ones(4, np.int32))
    f = kiln.full((2, 2), 7)
    assert f.dtype is kiln.int64 and (f.numpy() == 7).all()
    assert kiln.full((2,), 0.5).dtype is kiln.float32
    assert kiln.full((2,), True).dtype is kiln.bool
    np.testing.assert_array_equal(kiln.arange(5).numpy(), np.arange(5))
    assert kiln.arange(5).dtype is kiln.int64
    np.testing.assert_allclose(kiln.arange(0, 1, 0.25).numpy(), np.arange(0, 1, 0.25))
    r = kiln.randint(3, 9, (1000,))
    assert r.dtype is kiln.int64 and r.numpy().min() >= 3 and r.numpy().max() < 9
    assert kiln.randint(5, (10,)).numpy().max() < 5
    u = kiln.rand(10000, dtype=kiln.float64).numpy()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    n = kiln.randn(20000, dtype=kiln.float64).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    assert kiln.zeros_like(kiln.ones(3, dtype=kiln.float16)).dtype is kiln.float16


def test_manual_seed_reproducible():
    kiln.manual_seed(7)
    a = kiln.randn(16).numpy().copy()
    kiln.manual_seed(7)
    np.testing.assert_array_equal(a, kiln.randn(16).numpy())


def test_tensor_from_data():
    t = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.dtype is kiln.float32 and t.shape == (2, 2)
    assert kiln.tensor([1, 2, 3]).dtype is kiln.int64
    assert kiln.tensor([True, False]).dtype is kiln.bool
    assert kiln.tensor(np.arange(3, dtype=np.float64)).dtype is kiln.float64
    assert kiln.tensor(2.5).shape == () and kiln.tensor(2.5).item() == 2.5
    big = 2**62 + 1
    assert kiln.tensor([big]).item() == big  # int64 exact, never through a double
    x = kiln.tensor([1.5, 2.5], dtype=kiln.bfloat16, requires_grad=True)
    assert x.dtype is kiln.bfloat16 and x.requires_grad and x.is_leaf


def test_item_and_python_scalars():
    assert isinstance(kiln.tensor(3).item(), int)
    assert isinstance(kiln.tensor(3.0).item(), float)
    assert kiln.tensor(True).item() is True
    assert float(kiln.tensor([2.0])) == 2.0 and int(kiln.tensor([5])) == 5
    with pytest.raises(kiln.KilnError, match="item"):
        kiln.zeros(3).item()
    with pytest.raises(kiln.KilnError, match="ambiguous"):
        bool(kiln.zeros(3))


def test_repr_uses_kiln_printing():
    s = repr(kiln.arange(3))
    assert s.startswith("tensor(") and "0, 1, 2" in s


def test_views_share_memory(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = kiln.tensor(a)
    for v, ref in [(t.view(4, 3), a.reshape(4, 3)), (t.reshape(-1), a.reshape(-1)), (t.transpose(0, 1), a.T),
                   (t.t(), a.T), (t.T, a.T), (t.permute(1, 0), a.T), (t.unsqueeze(0), a[None]),
                   (t.view(1, 3, 4).squeeze(0), a), (t.flatten(), a.ravel()), (t.narrow(1, 1, 2), a[:, 1:3]),
                   (t.select(0, 2), a[2]), (t[None].expand(2, 3, 4), np.broadcast_to(a, (2, 3, 4)))]:
        np.testing.assert_array_equal(v.numpy(), ref)
    assert t.transpose(0, 1).data_ptr() == t.data_ptr()
    assert not t.t().is_contiguous() and t.t().contiguous().is_contiguous()
    assert t.t().stride() == (1, 4)


def test_getitem_setitem(rng):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    t = kiln.tensor(a)
    for idx in [1, -1, (1, 2), (slice(1, 3),), (slice(None), 2), (Ellipsis, 1), (slice(None, None, 2), None, 3),
                (slice(-3, None), slice(None), slice(1, 5, 2)), (0, Ellipsis, None)]:
        np.testing.assert_array_equal(t[idx].numpy(), a[idx], err_msg=str(idx))
    assert t[1:3].data_ptr() == t.data_ptr() + 1 * 5 * 6 * 4
    idx = kiln.tensor([3, 0, 2])
    np.testing.assert_array_equal(t[idx].numpy(), a[[3, 0, 2]])
    np.testing.assert_array_equal(t[:, idx].numpy(), a[:, [3, 0, 2]])
    t[0, 1:3] = 5.0
    a[0, 1:3] = 5.0
    t[1] = kiln.ones(5, 6)
    a[1] = 1.0
    np.testing.assert_array_equal(t.numpy(), a)
    with pytest.raises(IndexError, match="out of bounds"):
        t[4]
    with pytest.raises(kiln.KilnError, match="too many indices"):
        t[0, 0, 0, 0]


def test_conversions():
    t = kiln.randn(3, 4)
    assert t.to(kiln.float64).dtype is kiln.float64
    assert t.to("cpu").dtype is kiln.float32
    assert t.to("cpu", kiln.bfloat16).dtype is kiln.bfloat16
    assert t.to(dtype=kiln.float16).dtype is kiln.float16
    assert t.to(kiln.zeros(1, dtype=kiln.int32)).dtype is kiln.int32
    assert t.double().dtype is kiln.float64 and t.long().dtype is kiln.int64 and t.half().dtype is kiln.float16
    assert rel_error(t.bfloat16().float().numpy(), t.numpy()) < 1e-2
    c = t.clone()
    assert c.data_ptr() != t.data_ptr()
    np.testing.assert_array_equal(c.numpy(), t.numpy())
    assert t.cpu().data_ptr() == t.data_ptr()


def test_tolist_and_array():
    t = kiln.tensor([[1, 2], [3, 4]])
    assert t.tolist() == [[1, 2], [3, 4]]
    assert kiln.tensor([1.5], dtype=kiln.bfloat16).tolist() == [1.5]
    np.testing.assert_array_equal(np.asarray(t), [[1, 2], [3, 4]])


def test_errors_are_kiln_errors():
    assert issubclass(kiln.KilnError, RuntimeError)
    with pytest.raises(kiln.KilnError, match=r"\[matmul\]"):
        kiln.ones(2, 3) @ kiln.ones(2, 3)
    with pytest.raises(kiln.KilnError, match="view"):
        kiln.ones(2, 3).t().view(6)
    with pytest.raises(kiln.KilnError):
        kiln.ones(2) + kiln.ones(3)
    with pytest.raises(kiln.KilnError, match="reduction"):
        kiln.nn.functional.cross_entropy(kiln.randn(2, 3), kiln.tensor([0, 1]), reduction="avg")
    with pytest.raises(TypeError):
        kiln.zeros(2, dtype="complex64")
    if not kiln.cuda.is_available():
        with pytest.raises(kiln.KilnError):
            kiln.ones(2).cuda()


def test_hashable_and_identity():
    t = kiln.ones(2)
    assert {t: 1}[t] == 1
    u = t
    u += 1
    assert u is t and t.numpy().tolist() == [2.0, 2.0]
