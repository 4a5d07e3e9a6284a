"""The digest of a Python source's code alone: what stored choices (``tuner.fingerprint``) and
tilus's cache folder (``choice_cache.tilus_fixes_key``) are keyed to, so that an edit to a comment,
a blank line, the indentation or a docstring neither stales a shipped table nor rebuilds every
kernel, while any edit to the code does.

The code is the file's token stream less comments, blank lines, line breaks inside brackets and
docstrings (found through the tree). Tokens rather than ``ast.dump``: the digest must be the same
on every Python the package runs on (3.10-3.12), and ``ast.dump`` is not (3.12 adds
``type_params``, 3.13 leaves out empty fields); the token stream is, once 3.12's f-string tokens
are read back as the one string token earlier releases make.

Tokenizing a version's sources takes a fraction of a second, on the planner's thread at a
process's first call, so a digest is kept per sha256 of the file's bytes: in the process and in
``code-digests.json`` of the choice cache's folder, for every later process (a folder that cannot
be written only costs the time).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import tempfile
import threading
import tokenize
from pathlib import Path
from typing import Optional

# Part of every key of the memo: a change to what counts as code (this module's rules) is made with
# another RULES, so that no digest made under the old rules is read back.
RULES = "code-tokens-1"
MEMO_FILE = "code-digests.json"
MOST_KEPT = 1024  # digests in the memo file: the oldest go first

_VALUES = ("NAME", "NUMBER", "STRING", "OP")
_STRUCTURE = ("NEWLINE", "INDENT", "DEDENT")
_SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

_lock = threading.Lock()
_memo: Optional[dict[str, str]] = None  # content key -> digest: this process's, and the file's


def _docstrings(tree: ast.AST) -> dict[tuple[int, int], tuple[int, int]]:
    """Where each docstring stands: (line, byte column) of its start -> of its end."""
    spans = {}
    for node in ast.walk(tree):
        if isinstance(node, _SCOPES) and node.body:
            first = node.body[0]
            value = getattr(first, "value", None)
            if isinstance(first, ast.Expr) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                spans[(first.lineno, first.col_offset)] = (first.end_lineno, first.end_col_offset)
    return spans


def code_tokens(source: bytes) -> list[str]:
    """The tokens of ``source`` that are code, each as its kind and text ('NAME def', 'OP (',
    'INDENT'), in order; see the module's docstring for what is left out."""
    spans = _docstrings(ast.parse(source))
    rows = {row for row, _ in spans}
    lines = io.BytesIO(source).readlines()  # as tokenize reads them: its rows
    encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]

    def at(position: tuple[int, int]) -> tuple[int, int]:
        """A token's position as the tree gives it: tokenize counts characters, ast UTF-8 bytes."""
        row, column = position
        if row > len(lines):
            return position
        return row, len(lines[row - 1].decode(encoding)[:column].encode())

    def text(start: tuple[int, int], end: tuple[int, int]) -> str:
        chunk = "".join(line.decode(encoding) for line in lines[start[0] - 1 : end[0]])
        last = lines[end[0] - 1].decode(encoding)
        return chunk[start[1] : len(chunk) - len(last) + end[1]]

    found: list[str] = []
    skip_to: Optional[tuple[int, int]] = None  # the end of the docstring being dropped
    depth, f_start = 0, None  # within an f-string as 3.12 tokenizes it: from where
    for token in tokenize.tokenize(io.BytesIO(source).readline):
        kind = tokenize.tok_name[token.type]
        if skip_to is not None:
            if at(token.start) < skip_to:
                continue
            skip_to = None
            if kind == "NEWLINE" or (kind == "OP" and token.string == ";"):  # the docstring's own statement end
                continue
        if kind == "FSTRING_START":
            depth += 1
            f_start = f_start or token.start
        elif kind == "FSTRING_END":
            depth -= 1
            if not depth:
                found.append("STRING " + text(f_start, token.end))
                f_start = None
        elif depth:
            continue
        elif token.start[0] in rows and kind in ("STRING", "OP") and at(token.start) in spans:
            skip_to = spans[at(token.start)]
        elif kind in _STRUCTURE:
            found.append(kind)
        elif kind in _VALUES:
            found.append(f"{kind} {token.string}")
    return found


def digest_of(source: bytes) -> str:
    """The sha256 (hex) of ``source``'s code tokens, computed, not looked up."""
    return hashlib.sha256("\0".join(code_tokens(source)).encode()).hexdigest()


def code_digest(path: Path) -> str:
    """The digest of the code of the file at ``path`` (``digest_of`` its bytes), from the memo where
    these bytes were digested before."""
    source = path.read_bytes()
    key = hashlib.sha256(RULES.encode() + b"\0" + source).hexdigest()
    with _lock:
        memo = _loaded()
        if key in memo:
            return memo[key]
    digest = digest_of(source)
    with _lock:
        memo[key] = digest
        _store(key, digest)
    return digest


def _memo_path() -> Path:
    from .choice_cache import default_dir

    return default_dir() / MEMO_FILE


def _read(path: Path) -> dict[str, str]:
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in kept.items() if isinstance(v, str)} if isinstance(kept, dict) else {}


def _loaded() -> dict[str, str]:
    global _memo
    if _memo is None:
        _memo = _read(_memo_path())
    return _memo


def _store(key: str, digest: str) -> None:
    """Add one digest to the memo file (read again first: another process may have added its own),
    replaced whole, so that a reader sees the old file or the new one."""
    path = _memo_path()
    try:
        kept = {**_read(path), key: digest}
        kept = dict(list(kept.items())[-MOST_KEPT:])
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".code-digests.", delete=False) as out:
            json.dump(kept, out)
        os.replace(out.name, path)
    except OSError:
        pass  # a read-only cache: the digest is computed again by the next process
