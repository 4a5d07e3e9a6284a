"""The tutorial notebooks (tutorials/v*.ipynb): committed clean, and each runs top to bottom.

Each notebook is executed in a fresh Jupyter kernel (nbclient + ipykernel) running this
interpreter; a cell that raises fails the test with the cell's traceback. Without a GPU the
notebooks build their kernels and show the PTX; on a Hopper or Blackwell GPU they also check the
kernels of that architecture against a float32 reference and time them against cuBLAS.
"""

import json
import os
import re
from pathlib import Path

import pytest

from matmul.kernels import versions

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("v*.ipynb"))
CELL_TIMEOUT_S = 600  # one cell may build two kernels from scratch on a slow machine


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _version(path: Path) -> str:
    return _load(path)["metadata"]["tutorial"]["version"]


def test_there_are_notebooks():
    assert NOTEBOOKS and [p.name[:2] for p in NOTEBOOKS] == [f"v{i}" for i in range(len(NOTEBOOKS))], \
        "tutorials/ holds v0_*.ipynb, v1_*.ipynb, ... in order, none missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    """Notebooks are committed stripped: no outputs, no execution counts (the outputs depend on the
    machine that ran them; run the notebook to see them)."""
    nb = _load(path)
    dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shows_the_series_from_the_modules(path):
    """Each notebook takes the kernel from the matmul module (no second copy of its code), shows
    what changed, builds both architectures, has the live GPU part and the closing figure."""
    code = "\n".join("".join(c["source"]) for c in _load(path)["cells"] if c["cell_type"] == "code")
    for call in ("show_source(", "show_diff(", "show_docstring(", "show_results("):
        assert call in code, f"{path.name} does not call {call}...)"
    for arch, name in (("sm_100a", "BLACKWELL"), ("sm_90a", "HOPPER")):
        assert arch in code
        assert re.search(rf"show_build\(\s*({name}|\"{arch}\")", code), f"{path.name} does not build for {arch}"
        assert re.search(rf"live\(\s*({name}|\"{arch}\")", code), f"{path.name} has no live part for {arch}"
    assert "tcgen05.mma(" not in code and "wgmma.mma(" not in code, f"{path.name} copies kernel code"


def test_readme_lists_every_notebook():
    readme = (TUTORIALS / "README.md").read_text()
    missing = [p.name for p in NOTEBOOKS if p.name not in readme]
    assert not missing, f"tutorials/README.md does not mention {missing}"


def _runner():
    if os.environ.get("CI"):  # CI installs '.[test]': a missing runner is a failure there
        import nbclient  # noqa: F401
    return pytest.importorskip("nbclient", reason="the notebook runner is in the test extra: pip install -e '.[test]'")


def _executor():
    """tutorials/_run.py, the runner the notebooks' README describes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tutorials_run", TUTORIALS / "_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.notebook
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    _runner()
    version = _version(path)
    missing = [arch for arch in versions.ARCHS if version not in versions.available(arch)]
    if missing:
        pytest.skip(f"{version} does not exist yet for {', '.join(missing)}")
    # raises CellExecutionError (with the failing cell and its traceback) if a cell fails
    _executor().execute(path, timeout=CELL_TIMEOUT_S)


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_runner_fails_on_a_failing_cell(tmp_path):
    """The runner does not swallow errors: a cell that raises fails the notebook."""
    _runner()
    import nbformat
    from nbclient.exceptions import CellExecutionError
    from nbformat.v4 import new_code_cell, new_notebook

    path = tmp_path / "broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("raise RuntimeError('boom')"),
                                       new_code_cell("y = 2")]), path)
    with pytest.raises(CellExecutionError, match="boom"):
        _executor().execute(path, timeout=120)
