"""The Python examples of docs/using.md run as written (so the guide cannot drift from the API)."""
import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "using.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_guide_has_python_examples():
    assert SNIPPETS, f"{GUIDE} lost its ```python examples"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_guide_example_runs(index, capsys):
    exec(compile(SNIPPETS[index], f"{GUIDE.name}[python example {index}]", "exec"), {"__name__": "__guide__"})
    out = capsys.readouterr().out
    assert re.search(r"loss \d+\.\d+ on (cpu|cuda)", out), out
