"""No measurement history in the package's prose (issue #68): the comments and docstrings of
``matmul/**/*.py`` and ``pipeline/**/*.py``, and the package's ``.md`` pages, say what the code does
and why, not what was measured when. A figure (a ratio to cuBLAS, microseconds, TFLOP/s, a measured
percentage), a GPU named as where something ran ("on the H100"), a date, a commit hash or a "used to
be" belongs in ``plots/``, beside the command that made it, or in a commit message; a rule in the
code keeps one line of why and the ``plots/`` folder that justifies it (``plots/h100/skinny/``).

Code is not scanned (a GPU's name in a table of shipped choices is data), nor prose that names an
architecture (sm_90a, Hopper, Blackwell) or a GPU as hardware ("an NVIDIA H100 SXM's 132 SMs").
"""

import ast
import fnmatch
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("matmul/**/*.py", "pipeline/**/*.py", "matmul/**/*.md", "pipeline/**/*.md")

# Files whose history another change is taking out: skipped here until it lands. This set must end
# empty; take a file out of it when it is clean.
PENDING: set = set()

# Pages whose subject is where and when something was measured, each with its reason.
EXEMPT = {
    # the shipped tables' provenance (GPU, driver, date, the sources' commit, "Stale since <commit>",
    # which tests/test_choices.py holds it to): what a table is, not a comment on code
    "matmul/call/shipped/README.md",
    # the figure test's own rules, each with an example of the figure it describes
    "matmul/harness/figures.py",
}
# a link to results the tree no longer holds ("plots/h200/v8-tokens/ of commit b43a7e1"): where a
# rule's evidence is, not history
EVIDENCE = re.compile(r"plots/\S+ of commit [0-9a-f]{7,40}\b")

_GPU = r"(?:[HB][12]00|GB200|A100|RTX ?\d{4})"
PATTERNS = {
    "a ratio": r"\b\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?x\b(?!\d)",
    "a time": r"\b\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s*(?:us|µs|μs|ns|microseconds?)\b",
    "a rate": r"\b\d+(?:\.\d+)?\s*(?:T|G)FLOP",
    "a percentage": r"\b\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s*%",
    "a GPU as where it ran": rf"(?<!NVIDIA )\b{_GPU}\b",
    "a date": r"\b20\d\d-\d\d-\d\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b",
    "a commit hash": r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b",
    # ("no longer" is how a version of the series says what its step changed: not history)
    "then and now": (
        r"\b(?:used to be|any ?more|until recently|previously|formerly|at the time|in a first run|"
        r"(?:was|were) (?:faster|slower|fastest|slowest)|(?:measured|timed|seen) on (?:the|an?))\b"
    ),
}
_COMPILED = [
    (what, re.compile(pattern, re.IGNORECASE if what == "then and now" else 0)) for what, pattern in PATTERNS.items()
]


def history(text: str) -> list[str]:
    """What in a line of prose is history: the kinds of ``PATTERNS`` it matches, with the match."""
    text = EVIDENCE.sub("plots/", text)
    return [f"{what} ({match.group(0)!r})" for what, pattern in _COMPILED for match in pattern.finditer(text)]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a file's prose: a page's every line; a module's comments and the
    lines of its docstrings (any string that is a statement of its own)."""
    source = path.read_text()
    if path.suffix == ".md":
        return list(enumerate(source.splitlines(), 1))
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            segment = ast.get_source_segment(source, node.value) or ""
            lines += [(node.lineno + i, text) for i, text in enumerate(segment.splitlines())]
    return sorted(lines)


def scanned_files() -> list[str]:
    names = {str(path.relative_to(ROOT)) for pattern in SCANNED for path in ROOT.glob(pattern)}
    return sorted(names)


def pending(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in PENDING)


def findings(name: str) -> list[str]:
    return [
        f"{name}:{number}: {', '.join(found)}: {text.strip()}"
        for number, text in prose_lines(ROOT / name)
        if (found := history(text))
    ]


def test_no_history_in_the_package():
    found = [line for name in scanned_files() if name not in EXEMPT and not pending(name) for line in findings(name)]
    assert not found, "measurement history in comments or docstrings (move it to plots/):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "# runs at 1.07x cuBLAS on qkv",
        "# 0.58-0.65x cuBLAS fp16 at 1024 to 4096 tokens",
        "took 74 us at 17 x 28672 x 4096",
        "reaches 610 TFLOP/s",
        "without it V8 is only 7-16% faster",
        "# Measured on the H100 (plots/h100/skinny/)",
        "faster on the H200: plots/h200/v8-scale-after/",
        "# as of 2026-11-30",
        "stale since 227ceab",
        "the fix used to be needed",
        "In a first run of this pass the call took longer",
        "# deeper rings were slower",
    ],
)
def test_history_is_found(line):
    assert history(line)


@pytest.mark.parametrize(
    "line",
    [
        "# Smaller tiles are slower (plots/h100/candidates/)",
        "# The SMs of an NVIDIA H100 SXM: the grid used where no GPU is present",
        "sm_90a and sm_100a: Hopper and Blackwell",
        "# 128 x 256 tiles, a 2x1 cluster, m64n256k16, 0xffffffff",
        "# a version must beat cuBLAS by more than this share of its call time",
        "# before the TMA store; the stage is full now",
        "the accumulator no longer lives in registers; the phases completed so far",
        "what was measured, where, how; where matmul() was timed first",
    ],
)
def test_rules_are_not_history(line):
    assert not history(line)


def test_the_scan_reads_comments_and_docstrings(tmp_path):
    path = tmp_path / "module.py"
    path.write_text(
        '"""Doc.\n\nRuns at 1.2x cuBLAS."""\n\nx = "1.2x"  # on the H100\n\n\ndef f():\n    """on the H200"""\n'
    )
    assert [number for number, text in prose_lines(path) if history(text)] == [3, 5, 9]
