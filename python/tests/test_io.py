"""kiln.load / kiln.save: safetensors and torch zip round trips, format detection, torch interop."""
import numpy as np
import pytest

import kiln


def sample():
    return {"w": kiln.randn(4, 3), "b": kiln.arange(5), "h": kiln.randn(2, 2, dtype=kiln.bfloat16),
            "flag": kiln.tensor([True, False])}


@pytest.mark.parametrize("fmt,ext", [("safetensors", ".safetensors"), ("torch", ".pt")])
def test_round_trip(tmp_path, fmt, ext):
    d = sample()
    path = tmp_path / f"ck{ext}"
    kiln.save(d, path)  # format from the extension
    back, meta, detected = kiln.load(path, return_metadata=True)
    assert detected == ("safetensors" if fmt == "safetensors" else "torch-zip")
    assert set(back) == set(d)
    for k, v in d.items():
        assert back[k].dtype is v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k].float().numpy(), v.float().numpy())


def test_metadata_names_and_mmap(tmp_path):
    path = tmp_path / "model.bin.safetensors"
    kiln.save(sample(), path, metadata={"step": 10})
    t, meta, _ = kiln.load(path, names=["w"], mmap=True, return_metadata=True)
    assert list(t) == ["w"] and meta == {"step": "10"}
    with pytest.raises(kiln.KilnError):
        kiln.load(path, names=["missing"])


def test_errors(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(kiln.KilnError):
        kiln.load(bad)
    with pytest.raises(TypeError):  # numbers and containers save (test_io_nested.py); objects do not
        kiln.save({"x": object()}, tmp_path / "x.safetensors")
    with pytest.raises(kiln.KilnError):
        kiln.load(tmp_path / "nope.pt")


def test_torch_reads_and_writes(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "k.pt"
    kiln.save({"w": kiln.randn(3, 2)}, path, format="torch")
    sd = torch.load(path, weights_only=True)
    np.testing.assert_array_equal(sd["w"].numpy(), kiln.load(path)["w"].numpy())
    path2 = tmp_path / "t.pt"
    ref = {"a": torch.randn(2, 3), "b": torch.arange(4)}
    torch.save(ref, path2)
    got = kiln.load(path2)
    for k in ref:
        np.testing.assert_array_equal(got[k].numpy(), ref[k].numpy())
