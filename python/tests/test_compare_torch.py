"""Smoke test of python/bench/compare_torch.py (the GPU comparison script): a tiny --quick run on the
CPU must complete and write the JSON the lead reads. Skips (with the reason) without torch."""
import importlib.util
import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: compare_torch.py smoke run skipped")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "compare_torch.py")


def load_script():
    spec = importlib.util.spec_from_file_location("compare_torch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_torch_quick_cpu(tmp_path, capsys):
    out = tmp_path / "compare_torch.json"
    result = load_script().main(["--device", "cpu", "--quick", "--warmup", "0", "--iters", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["meta"]["torch"] == torch.__version__ and data["meta"]["iters"] == 1
    assert [r["name"] for r in data["lce"]] == [r["name"] for r in result["lce"]]
    lce = data["lce"][0]["variants"]
    for name in ("torch_eager", "kiln_memory", "kiln_speed", "gemm3"):
        assert lce[name]["fwd_bwd_ms"] > 0, (name, lce[name])
    assert lce["kiln_memory"]["kiln_peak_mib"] > 0
    assert len(data["flex"]) == 3
    for row in data["flex"]:
        kf = row["variants"]["kiln_flex"]
        assert kf["fwd_ms"] > 0 and kf["fwd_bwd_ms"] > 0, (row["name"], kf)
        assert row["info"]["kiln_block_mask_bytes"] > 0
        assert "torch_flex" in row["variants"]
    table = capsys.readouterr().out
    assert "kiln_flex" in table and "torch_eager" in table and "wrote" in table
