"""The committed results' index and the figures the prose quotes (``matmul.harness.figures``).

* ``plots/README.md`` and every results folder's README.md are what ``python -m matmul figures``
  makes of the committed results files, and every folder with results is described there;
* plots/ holds results only: no script, nothing else;
* every figure (a ratio like ``1.07x``, a percentage, a time in us or ms, a rate in TFLOP/s, TB/s
  or GB/s; the module's docstring says exactly what counts and how it may be rounded) quoted in the
  prose of README.md, tutorials/README.md and the notebooks' Markdown cells is held by a results
  file under plots/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from matmul.harness import figures

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def test_plots_readmes_are_what_the_command_makes():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in figures.expected_files(ROOT / "plots").items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"run `python -m matmul figures`: {stale}"


def test_every_results_folder_is_described():
    assert figures.unregistered_folders(ROOT / "plots") == []
    for folder in figures.folders():
        assert (ROOT / "plots" / folder.path).is_dir(), folder.path
        commands = ("python -m matmul", "MATMUL_", "python -m pytest")
        assert all(c.startswith(commands) for c in folder.commands), folder.commands


def test_plots_holds_results_only():
    others = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "plots").rglob("*")
        if p.is_file() and p.suffix not in figures.RESULT_SUFFIXES
    ]
    assert others == []


def test_check_fails_on_a_stale_index(tmp_path, capsys):
    """``--check`` on a copy of plots/ whose index lost a line fails; run without it, it mends it."""
    import shutil

    copy = tmp_path / "plots"
    shutil.copytree(ROOT / "plots", copy)
    assert figures.main(copy, check=True) == 0
    index = copy / "README.md"
    index.write_text(index.read_text().replace("geomean 1.072x", "geomean 1.27x"))
    assert figures.main(copy, check=True) == 1
    assert "1.27x" in capsys.readouterr().err
    assert figures.main(copy) == 0 and figures.main(copy, check=True) == 0


def test_a_figure_is_a_number_with_its_unit():
    text = (
        "V8 ran 1.50-2.57x cuBLAS, 63% of its floor, 12.3 us (`not 9.99x in code`); a 4096 x 4096 "
        "weight, 2x the tiles, 3.02 TB/s, 750 TFLOP/s, 1.47 ms"
    )
    found = [(f.text, f.unit) for f in figures.quoted_figures(figures.prose(text))]
    assert found == [
        ("1.50", "x"),
        ("2.57", "x"),
        ("63", "%"),
        ("12.3", "us"),
        ("3.02", "tb/s"),
        ("750", "tflops"),
        ("1.47", "ms"),
    ]


def test_a_figure_is_backed_by_a_number_that_rounds_to_it():
    backing = figures.Backing.__new__(figures.Backing)
    backing.numbers = {}
    backing.add("x", 1.0721)
    backing.add("us", 12.26)
    for values in backing.numbers.values():
        values.sort()
    assert all(backing.backs(figures.Figure(t, "x", "")) for t in ("1.07", "1.072", "1.1", "1"))
    assert not any(backing.backs(figures.Figure(t, "x", "")) for t in ("1.08", "1.071", "1.0722"))
    assert backing.backs(figures.Figure("107", "%", "")) and not backing.backs(figures.Figure("108", "%", ""))
    assert backing.backs(figures.Figure("12.3", "us", "")) and not backing.backs(figures.Figure("12.2", "us", ""))
    assert not backing.backs(figures.Figure("12.3", "ms", ""))


def unbacked(path: Path, prose: str | None = None) -> list[str]:
    """The figures of ``path``'s prose (``prose`` instead, if given) that no results file of the
    folders ``path`` cites holds."""
    raw = path.read_text()
    text = prose if prose is not None else figures.notebook_markdown(path) if path.suffix == ".ipynb" else raw
    backing = figures.Backing(ROOT / "plots", figures.cited_folders(raw, ROOT / "plots"))
    return [f"{f.text}{f.unit}: ...{f.where}..." for f in figures.unbacked_figures(text, backing)]


def test_tutorials_readme_figures_are_in_results_files():
    assert unbacked(ROOT / "tutorials" / "README.md") == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_figures_are_in_results_files(notebook):
    assert figures.cited_folders(notebook.read_text(), ROOT / "plots")
    assert unbacked(notebook) == []


def test_readme_figures_are_in_results_files():
    assert unbacked(ROOT / "README.md") == []


def test_a_planted_figure_is_caught():
    """A figure no results file holds, planted in a notebook's Markdown, is reported, and only it; so is
    one that only a folder the document does not cite holds (the H200's model run: 1.098x)."""
    notebook = NOTEBOOKS[-1]
    text = figures.notebook_markdown(notebook) + "\n\nV8 runs 3.47x cuBLAS at 7.77 us, 0.98x at 8192^3."
    assert [f.split(":")[0] for f in unbacked(notebook, text)] == ["3.47x", "7.77us"]
    series = ROOT / "tutorials" / "README.md"
    assert [f.split(":")[0] for f in unbacked(series, "matmul() ran 1.098x torch.matmul")] == ["1.098x"]
    assert figures.Backing(ROOT / "plots").backs(figures.Figure("1.098", "x", ""))


def plots_links(text: str) -> list[str]:
    """The paths under plots/ a text names, but those given as a commit's ("plots/x/ of commit abc1234")."""
    found = re.finditer(r"plots/[A-Za-z0-9_./-]*[A-Za-z0-9_/-]", text)
    return [m.group(0) for m in found if not text.startswith(" of commit", m.end())]


def test_every_plots_path_the_tree_names_exists():
    """A path under plots/ named by the package, the tests, the tutorials or the docs exists (a result
    that left the tree is named with the commit that has it)."""
    sources = [ROOT / name for name in ("README.md", "CONTRIBUTING.md")]
    for folder in ("matmul", "pipeline", "tests", "tutorials"):
        sources += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".ipynb", ".json")]
    missing = [
        f"{path.relative_to(ROOT)}: {link}"
        for path in sources
        if path.name != "test_no_history.py"  # its samples of history
        for link in plots_links(path.read_text())
        if not (ROOT / link).exists()
    ]
    assert missing == []
