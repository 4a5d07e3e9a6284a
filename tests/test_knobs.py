"""Every environment variable the package reads is a knob of ``matmul.knobs``, read there alone."""

import ast
import logging
import re
from pathlib import Path

import pytest

from matmul import knobs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = sorted([*(ROOT / "matmul").rglob("*.py"), *(ROOT / "pipeline").rglob("*.py")])
KNOBS_FILE = ROOT / "matmul" / "knobs.py"
NOT_KNOBS = {"PATH"}  # the build of the native entry puts ninja on it for the compiler


def _reads(tree: ast.AST):
    """The environment reads in ``tree``: (line, name or None) for ``os.environ[...]``,
    ``os.environ.get(...)`` and ``os.getenv(...)``."""
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            if isinstance(node.ctx, ast.Load):
                target = node.slice
            else:
                continue
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            target = node.args[0] if node.args else None
        else:
            continue
        yield node.lineno, target.value if isinstance(target, ast.Constant) else None


def environment_reads(files) -> list[str]:
    """'file:line name' for every environment read outside ``matmul.knobs`` that is not of NOT_KNOBS."""
    found = []
    for path in files:
        if path == KNOBS_FILE:
            continue
        for line, name in _reads(ast.parse(path.read_text())):
            if name not in NOT_KNOBS:
                found.append(f"{path.name}:{line} {name or '(computed name)'}")
    return found


def test_the_package_reads_the_environment_only_through_the_knobs():
    assert environment_reads(PACKAGE_FILES) == []


def test_the_scan_finds_a_read_outside_the_knobs(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('import os\nA = os.environ.get("MATMUL_X")\nB = os.getenv("Y")\nC = os.environ["Z"]\n')
    assert [r.split(" ")[1] for r in environment_reads([planted])] == ["MATMUL_X", "Y", "Z"]


def test_every_variable_the_package_names_is_a_knob():
    """A ``MATMUL_*`` or ``TILUS_*`` name in the package's code is one of the table's (a test's own
    variables live in tests/)."""
    named = set()
    for path in PACKAGE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named |= set(re.findall(r"\b((?:MATMUL|TILUS)_[A-Z_]+)\b", node.value))
    assert named - set(knobs.KNOBS) == set()


def test_the_call_readme_lists_every_knob():
    text = (ROOT / "matmul" / "call" / "README.md").read_text()
    assert knobs.table() in text


def test_a_knob_that_does_not_parse_warns_and_keeps_its_default(monkeypatch, caplog):
    monkeypatch.setenv("MATMUL_TUNE", "sometimes")
    with caplog.at_level(logging.WARNING, logger="matmul"):
        assert knobs.tune_mode() == "background"
    assert "MATMUL_TUNE=sometimes" in caplog.text
    monkeypatch.setenv("MATMUL_TUNE", "Blocking")
    assert knobs.tune_mode() == "blocking"
    monkeypatch.setenv("MATMUL_TUNE_MAX_HOLD_S", "inf")
    assert knobs.get("MATMUL_TUNE_MAX_HOLD_S") == float("inf")


def test_cache_dir_follows_the_knobs(monkeypatch, tmp_path):
    monkeypatch.delenv("MATMUL_CACHE_DIR", raising=False)
    monkeypatch.delenv("TILUS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert knobs.cache_dir() == tmp_path / "xdg" / "tilus-matmul" and knobs.tilus_cache_base() is None
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path / "mine"))
    assert knobs.tilus_cache_base() == tmp_path / "mine" / "tilus"
    monkeypatch.setenv("TILUS_CACHE_DIR", str(tmp_path / "tilus"))
    assert knobs.tilus_cache_base() == tmp_path / "tilus"


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False)])
def test_the_decision_log_switch(monkeypatch, value, on):
    monkeypatch.setenv("MATMUL_LOG", value)
    knobs.apply_logging()
    try:
        assert knobs.decisions.isEnabledFor(logging.INFO) is on
    finally:
        monkeypatch.setenv("MATMUL_LOG", "0")
        knobs.apply_logging()
