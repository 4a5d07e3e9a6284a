"""The tutorial notebooks (tutorials/v*.ipynb): committed with their outputs (from a run on the
project's H100, so that a reader sees the code, the results and the figures on the page), each
with what it teaches, its measured result, an exercise; and each runs top to bottom.

A copy of each notebook is executed in a fresh Jupyter kernel (nbclient + ipykernel) running this
interpreter; a cell that raises fails the test with the cell's traceback; the committed file is
never rewritten. Without a GPU the notebooks build their kernels and show the PTX; on a Hopper or
Blackwell GPU they also check the kernels of that architecture against a float32 reference and
time them against cuBLAS.
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


def _archs(path: Path) -> list[str]:
    """The architectures the notebook's version exists for: both, unless its metadata names fewer
    (``tutorial.archs``: V8 is a Hopper kernel only)."""
    return _load(path)["metadata"]["tutorial"].get("archs", list(versions.ARCHS))


def _exists(arch: str, version: str) -> bool:
    """Whether the version's module is there (``versions.available`` lists only the series V0-V7)."""
    import importlib.util

    return importlib.util.find_spec(versions.module_name(arch, version)) is not None


def test_there_are_notebooks():
    assert NOTEBOOKS and [p.name[:2] for p in NOTEBOOKS] == [f"v{i}" for i in range(len(NOTEBOOKS))], (
        "tutorials/ holds v0_*.ipynb, v1_*.ipynb, ... in order, none missing"
    )


def _markdown(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_with_outputs(path):
    """A reader browsing the repository sees what the notebook printed: every code cell was
    executed, they show outputs, and the first output names the commit that produced them."""
    nb = _load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    unrun = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is None]
    assert not unrun, f"{path.name}: cells {unrun} were not executed; run python tutorials/_run.py --inplace"
    shown = sum(1 for c in code if c.get("outputs"))
    assert shown >= len(code) // 2, f"{path.name}: only {shown} of {len(code)} code cells have outputs"
    errors = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert not errors, f"{path.name}: code cells {errors} show errors"
    first = json.dumps(next(c["outputs"] for c in code if c.get("outputs")))
    assert "outputs of commit" in first, f"{path.name}: the first output does not name the commit (h.stamp())"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_teaches_measures_and_asks(path):
    """What you will learn at the top, the step's result on the H100, and an exercise whose answer
    is hidden in a <details> block."""
    cells = _markdown(_load(path))
    headings = [line for text in cells for line in text.splitlines() if line.startswith("#")]
    assert any("What you will learn" in line for line in headings), f"{path.name}: no 'What you will learn' cell"
    assert any("On the H100" in line for line in headings), f"{path.name}: no 'On the H100' cell"
    exercises = [text for text in cells if "<details>" in text and "</details>" in text and "Answer" in text]
    assert exercises, f"{path.name}: no exercise with its answer in <details><summary>Answer</summary>...</details>"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shows_the_series_from_the_modules(path):
    """Each notebook takes the kernel from the matmul module (no second copy of its code), shows
    what changed, builds both architectures, has the live GPU part and the closing figure."""
    nb = _load(path)
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    for call in ("show_source(", "show_diff(", "show_docstring(", "show_results("):
        assert call in code, f"{path.name} does not call {call}...)"
    archs = _archs(path)
    assert archs and set(archs) <= set(versions.ARCHS), f"{path.name}: tutorial.archs {archs}"
    prose = " ".join(_markdown(nb))
    for arch, name in (("sm_100a", "BLACKWELL"), ("sm_90a", "HOPPER")):
        if arch not in archs:  # a version of one architecture says, in its prose, that the other has none
            missing = f"no {versions.ARCH_NAMES[arch]} {_version(path).upper()}"
            assert missing in prose, f"{path.name} builds no {arch} kernel and does not say '{missing}'"
            continue
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
def test_notebook_runs(path, tmp_path):
    _runner()
    version = _version(path)
    missing = [arch for arch in _archs(path) if not _exists(arch, version)]
    if missing:
        pytest.skip(f"{version} does not exist yet for {', '.join(missing)}")
    committed = path.read_bytes()
    copy = tmp_path / path.name
    copy.write_bytes(committed)
    # raises CellExecutionError (with the failing cell and its traceback) if a cell fails; the copy
    # runs with tutorials/ as its working directory, as the notebook does in a front end
    _executor().execute(copy, timeout=CELL_TIMEOUT_S)
    assert path.read_bytes() == committed, f"running {path.name} rewrote the committed notebook"


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_runner_fails_on_a_failing_cell(tmp_path):
    """The runner does not swallow errors: a cell that raises fails the notebook."""
    _runner()
    import nbformat
    from nbclient.exceptions import CellExecutionError
    from nbformat.v4 import new_code_cell, new_notebook

    path = tmp_path / "broken.ipynb"
    nbformat.write(
        new_notebook(
            cells=[new_code_cell("x = 1"), new_code_cell("raise RuntimeError('boom')"), new_code_cell("y = 2")]
        ),
        path,
    )
    with pytest.raises(CellExecutionError, match="boom"):
        _executor().execute(path, timeout=120)


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_runner_keeps_progress_bars_out_of_the_outputs(tmp_path):
    """A kernel build's progress bar (tqdm, on stderr) is not part of what a notebook teaches: the
    committed outputs must not fill up with them."""
    _runner()
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    path = tmp_path / "bars.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("from tqdm import tqdm\nprint(sum(tqdm(range(3))))")]), path)
    executed = _executor().execute(path, timeout=120)
    outputs = executed.cells[0].outputs
    assert [o.get("name") for o in outputs] == ["stdout"] and "3" in outputs[0]["text"], outputs


@pytest.mark.notebook
@pytest.mark.timeout(600)
def test_runner_inplace_tar_and_unpack(tmp_path):
    """The GPU run's flow: notebooks executed in place (stamped with the commit that ran them),
    packed into one tar, unpacked into a tutorials folder (only notebooks; nothing else)."""
    _runner()
    import tarfile

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    run = _executor()
    source = tmp_path / "run"
    source.mkdir()
    path = source / "v9_tiny.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), path)
    broken = source / "v8_broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("raise RuntimeError('boom')")]), broken)
    before = broken.read_bytes()
    tar = tmp_path / "notebooks.tar"
    # --keep-going: the broken notebook is reported, left as it was and out of the pack; exit 1
    assert run.main([str(broken), str(path), "--inplace", "--tar", str(tar), "--keep-going"]) == 1
    assert broken.read_bytes() == before
    with tarfile.open(tar) as archive:
        assert archive.getnames() == ["v9_tiny.ipynb"]
    executed = nbformat.read(path, as_version=4)
    assert "42" in executed.cells[0].outputs[0]["text"]
    assert executed.metadata["tutorial"]["executed"]["commit"]
    into = tmp_path / "tutorials"
    into.mkdir()
    assert run.unpack(tar, into) == [into / "v9_tiny.ipynb"]
    assert (into / "v9_tiny.ipynb").read_bytes() == path.read_bytes()

    stray = tmp_path / "stray.tar"
    with tarfile.open(stray, "w") as archive:
        archive.add(path, arcname="../v9_tiny.ipynb")
    with pytest.raises(SystemExit, match="only tutorial notebooks"):
        run.unpack(stray, into)
