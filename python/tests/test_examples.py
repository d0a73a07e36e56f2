"""The scripts in examples/ run to completion (small sizes, bounded time) and print what they
promise. The PyTorch one exits cleanly with a message where torch is not installed."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kiln

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def env():
    """This interpreter's environment with the kiln under test first on the path (an absolute
    path: the README snippet runs in a scratch directory)."""
    path = [str(Path(kiln.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))

CASES = {
    "train_mlp.py": (["--steps", "150"], "reloaded from safetensors: identical outputs = True"),
    "load_hf_checkpoint.py": ([], "load_state_dict: <All keys matched successfully>"),
    "torch_with_kiln_kernels.py": (["--steps", "12"], None),
}


@pytest.mark.parametrize("script", list(CASES))
def test_example_runs(script):
    args, expected = CASES[script]
    r = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                       timeout=240, env=env())
    assert r.returncode == 0, f"{script} failed:\n{r.stdout}\n{r.stderr}"
    if script == "torch_with_kiln_kernels.py":
        has_torch = importlib.util.find_spec("torch") is not None
        expected = "trained through kiln's flex_attention" if has_torch else "PyTorch is not installed"
    assert expected in r.stdout, r.stdout


def test_readme_model_snippet_runs(tmp_path):
    """python/README.md's kiln.nn / kiln.optim snippet, run as written (in a scratch directory)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b.split("```")[0] for b in text.split("```python\n")[1:]]
    snippet = next(b for b in blocks if "class MLP(nn.Module)" in b)
    r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env())
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mlp.safetensors").exists()
