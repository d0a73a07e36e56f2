"""kiln.save / kiln.load of nested objects (an optimizer's state_dict) and of file objects
(io.BytesIO, open files), weights_only accepted; iteration over tensors; Python-worded errors."""
import io
import math

import numpy as np
import pytest

import kiln


def optimizer_state():
    return {
        "state": {0: {"step": kiln.tensor(3.0), "exp_avg": kiln.randn(4, 3), "exp_avg_sq": kiln.rand(4, 3)},
                  1: {"step": kiln.tensor(3.0), "exp_avg": kiln.randn(3), "exp_avg_sq": kiln.rand(3)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                          "amsgrad": False, "foreach": None, "name": "decay", "params": [0, 1]}],
        "extra": {"inf": math.inf, "1.5": 1.5, "bf16": kiln.randn(2, dtype=kiln.bfloat16)},
    }


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, kiln.Tensor):
        assert a.dtype is b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.float().numpy(), b.float().numpy())
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("target", ["path", "bytesio", "open_file"])
def test_nested_round_trip(tmp_path, target):
    state = optimizer_state()
    path = tmp_path / "opt.pt"  # a .pt name: nested objects are still kiln's safetensors
    if target == "path":
        kiln.save(state, path)
        back = kiln.load(path, weights_only=True)
    elif target == "bytesio":
        buf = io.BytesIO()
        kiln.save(state, buf)
        buf.seek(0)
        back = kiln.load(buf, weights_only=True)
    else:
        with open(path, "wb") as f:
            kiln.save(state, f)
        with open(path, "rb") as f:
            back = kiln.load(f, weights_only=False)  # accepted; the loader is the same safe one
    assert_same(state, back)
    assert list(back["state"]) == [0, 1]  # int keys stay ints


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_flat_dict_through_file_objects(fmt):
    d = {"w": kiln.randn(4, 3), "i": kiln.arange(5)}
    buf = io.BytesIO()
    kiln.save(d, buf, format=fmt)
    data = buf.getvalue()
    assert data[:2] == b"PK" if fmt == "torch" else data[8:9] == b"{"
    back, _, detected = kiln.load(io.BytesIO(data), return_metadata=True)
    assert detected == ("torch-zip" if fmt == "torch" else "safetensors")
    assert_same(dict(sorted(d.items())), dict(sorted(back.items())))  # safetensors sorts its tensors


def test_nested_checkpoint_keeps_the_user_metadata(tmp_path):
    path = tmp_path / "ck.safetensors"
    kiln.save({"model": {"w": kiln.ones(2)}, "step": 7}, path, metadata={"run": "a"})
    obj, meta, _ = kiln.load(path, return_metadata=True)
    assert meta == {"run": "a"} and obj["step"] == 7
    assert kiln.load(path, names=["model.w"])["model.w"].tolist() == [1.0, 1.0]  # tensors by dotted path


def test_save_refuses_what_it_cannot_rebuild(tmp_path):
    with pytest.raises(TypeError, match="cannot save an object of type object"):
        kiln.save({"x": object()}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="dict keys"):
        kiln.save({(1, 2): kiln.ones(1)}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="format='torch'"):
        kiln.save({"a": [kiln.ones(1)]}, tmp_path / "x.pt", format="torch")
    with pytest.raises(ValueError, match="mmap"):
        kiln.load(io.BytesIO(b""), mmap=True)
    with pytest.raises(TypeError, match="binary mode"):
        kiln.load(io.StringIO("text"))


def test_torch_reads_a_flat_dict_from_a_file_object():
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    kiln.save({"w": kiln.arange(6).reshape(2, 3)}, buf, format="torch")
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_iteration_and_index_errors():
    t = kiln.arange(6).reshape(3, 2)
    rows = list(t)
    assert len(rows) == 3 and [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    a, b, c = kiln.arange(3)
    assert (a.item(), b.item(), c.item()) == (0, 1, 2)
    assert sum(r.sum().item() for r in t) == 15
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        t[3]
    with pytest.raises(TypeError, match="0-d"):
        iter(kiln.tensor(1.0))


def test_messages_use_python_spellings():
    w = kiln.ones(3, requires_grad=True)
    with pytest.raises(kiln.KilnError) as e:
        w.add_(1.0)
    assert "kiln.no_grad()" in str(e.value) and "::" not in str(e.value)
    y = (w * w).sum()
    y.backward()
    with pytest.raises(kiln.KilnError) as e:
        y.backward()
    assert "retain_graph=True" in str(e.value) and "=true" not in str(e.value)
