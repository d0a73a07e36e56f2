"""pytest setup for kiln's Python tests.

Fast dev path (the extension built in the C++ build tree, no pip install):
    cmake -S . -B build -G Ninja -DKILN_PYTHON=ON && ninja -C build kiln_python
    PYTHONPATH=build/python python -m pytest python/tests -q
(`make test-python` does exactly this.) After `pip install .`, plain `pytest python/tests` works.
CUDA tests skip with a message when kiln has no GPU; torch tests skip when torch is missing.
"""
import numpy as np
import pytest

import kiln


@pytest.fixture(autouse=True)
def _seed():
    kiln.manual_seed(1234)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def rel_error(out, ref):
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert not np.isnan(out).any(), "NaN in output"
    denom = np.linalg.norm(ref.ravel())
    return np.linalg.norm((out - ref).ravel()) / (denom if denom > 0 else 1.0)


TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2, "float16": 2e-3}

requires_cuda = pytest.mark.skipif(not kiln.cuda.is_available(), reason="kiln has no CUDA device here")
