"""Stored choices and tilus's cache folder are keyed to the code of the kernel sources, not their
bytes (``matmul.call.code_digest``): a comment or a docstring edited keeps them, code edited does not."""

import json
from pathlib import Path

import pytest

from matmul.call import choice_cache, code_digest, tuner
from matmul.call.code_digest import code_tokens, digest_of

ARCH = "sm_90a"

# A source with what the rules must tell apart: docstrings of a module, a class, functions (one on the
# header's line), a string statement that is not a docstring, f-strings nested and spread over lines,
# a non-ASCII name before a docstring on its line, implicit concatenation.
SAMPLE = '''"""The module's docstring."""
# a comment
import os  # a trailing comment


class K:
    """A class's docstring,
    on two lines."""

    size = 4

    def f(self, x):
        """A method's."""
        "not a docstring: the second statement"
        return f"{x!r:>{self.size}} {f'{x}'}" + "a" "b"


def g(): "a one-line docstring"; return os.sep


def é(): "after a non-ASCII name"; return f"""{
1 + 2}"""


def h(x):
    if x:
        x += 1
    return x
'''
# digest_of(SAMPLE) on CPython 3.10, 3.11, 3.12 and 3.13 (each run by hand): the shipped tables'
# fingerprints must not depend on the Python that reads them
SAMPLE_DIGEST = "e0f7f7b0f6b495d6a6c5c4040475fbfed2da1b39e56b50d5bdbe28b59b8ba44f"


def test_the_code_of_a_source_is_its_tokens_less_comments_blank_lines_and_docstrings():
    tokens = code_tokens(SAMPLE.encode())
    text = " ".join(tokens)
    assert "docstring," not in text and "A method's" not in text and "comment" not in text
    assert "one-line docstring" not in text and "non-ASCII name" not in text
    assert 'STRING "not a docstring: the second statement"' in tokens
    assert "STRING f\"{x!r:>{self.size}} {f'{x}'}\"" in tokens  # an f-string: one token, on every Python
    assert 'STRING f"""{\n1 + 2}"""' in tokens
    assert tokens[:4] == ["NAME import", "NAME os", "NEWLINE", "NAME class"]
    assert tokens.count("INDENT") == tokens.count("DEDENT") == 4


def test_the_digest_is_the_same_on_every_python():
    assert digest_of(SAMPLE.encode()) == SAMPLE_DIGEST


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("# a comment", "# another comment, longer"),
        lambda s: s.replace("import os  # a trailing comment", "import os"),
        lambda s: s.replace('"""A method\'s."""', '"""A method\'s docstring, rewritten."""'),
        lambda s: s.replace('    """A class\'s docstring,\n    on two lines."""\n', ""),  # a docstring taken out
        lambda s: s.replace('"""The module\'s docstring."""', '"""Another."""\n\n# and a comment'),
        lambda s: s.replace('"a one-line docstring"', '"another"'),
        lambda s: s.replace("\n\n\n", "\n\n\n\n\n"),  # blank lines
        lambda s: s.replace("    ", "  "),  # the indentation's width
        lambda s: s.replace("(self, x)", "(\n        self,\n        x,  # x\n    )").replace("x,  #", "x  #"),
    ],
)
def test_an_edit_of_a_comment_a_docstring_or_the_layout_keeps_the_digest(edit):
    edited = edit(SAMPLE)
    assert edited != SAMPLE
    assert digest_of(edited.encode()) == digest_of(SAMPLE.encode())


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("size = 4", "size = 5"),
        lambda s: s.replace("the second statement", "the 2nd statement"),  # a string statement, not a docstring
        lambda s: s.replace('"a" "b"', '"ab"'),
        lambda s: s.replace("{x!r:>", "{x!s:>"),
        lambda s: s.replace("x += 1\n    return", "x += 1\n        return"),  # the indentation's structure
        lambda s: s.replace("return os.sep", "return os.sep; pass"),
    ],
)
def test_an_edit_of_the_code_changes_the_digest(edit):
    edited = edit(SAMPLE)
    assert edited != SAMPLE
    assert digest_of(edited.encode()) != digest_of(SAMPLE.encode())


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """The digests' memo in a folder of the test's own."""
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(code_digest, "_memo", None)


def edited_file(monkeypatch, name: str, edit) -> None:
    """Every read of a file called ``name`` (as the fingerprints read them) sees it edited."""
    read_bytes = Path.read_bytes

    def read(path):
        source = read_bytes(path)
        return edit(source.decode()).encode() if path.name == name else source

    monkeypatch.setattr(Path, "read_bytes", read)


COMMENT_EDITS = {
    "a comment": lambda s: s.replace("\n#", "\n# edited:", 1) + "\n# one more comment\n",
    "a docstring": lambda s: s.replace('"""', '"""Edited. ', 1),
    "blank lines": lambda s: s.replace("\n\n", "\n\n\n"),
}


@pytest.mark.parametrize("what", COMMENT_EDITS)
@pytest.mark.parametrize("name", ["v7.py", "pipeline.py", "wgmma_descriptor_offsets.py"])
def test_a_kernel_sources_comment_or_docstring_edited_keeps_its_stored_choices(memo, monkeypatch, name, what):
    """Hopper V7's own file, the ring it imports from pipeline/ and a tilus fix: an edit of a comment,
    a docstring or blank lines keeps V7's fingerprint (its shipped entries stay final) and tilus's
    cache folder (no kernel is built again)."""
    before = tuner.fingerprint.__wrapped__(ARCH, "v7"), choice_cache.tilus_fixes_key()
    source = next(p for p in tuner.fingerprint_files(ARCH, "v7") if p.name == name).read_text()
    assert COMMENT_EDITS[what](source) != source
    edited_file(monkeypatch, name, COMMENT_EDITS[what])
    assert (tuner.fingerprint.__wrapped__(ARCH, "v7"), choice_cache.tilus_fixes_key()) == before


@pytest.mark.parametrize("name", ["v7.py", "pipeline.py", "wgmma_descriptor_offsets.py"])
def test_a_kernel_sources_code_edited_stales_its_stored_choices(memo, monkeypatch, name):
    before = tuner.fingerprint.__wrapped__(ARCH, "v7")
    fixes_key = choice_cache.tilus_fixes_key()
    edited_file(monkeypatch, name, lambda s: s + "\nEDITED = 1\n")
    assert tuner.fingerprint.__wrapped__(ARCH, "v7") != before
    assert (choice_cache.tilus_fixes_key() != fixes_key) == (name == "wgmma_descriptor_offsets.py")


def test_a_digest_is_computed_once_per_content_and_read_back_by_a_later_process(memo, tmp_path, monkeypatch):
    """Tokenizing is slow next to reading: a file's digest is kept by the sha256 of its bytes, in the
    process and in the cache folder's memo, which a later process (here: the memo of this one
    forgotten) reads instead of tokenizing again; a file edited is digested again."""
    source = tmp_path / "kernel.py"
    source.write_text(SAMPLE)
    computed = []
    digest = code_digest.digest_of
    monkeypatch.setattr(code_digest, "digest_of", lambda s: computed.append(1) or digest(s))
    assert code_digest.code_digest(source) == SAMPLE_DIGEST and len(computed) == 1
    assert code_digest.code_digest(source) == SAMPLE_DIGEST and len(computed) == 1
    assert len(json.loads((tmp_path / code_digest.MEMO_FILE).read_text())) == 1
    monkeypatch.setattr(code_digest, "_memo", None)  # a new process
    assert code_digest.code_digest(source) == SAMPLE_DIGEST and len(computed) == 1
    source.write_text(SAMPLE + "x = 1\n")
    assert code_digest.code_digest(source) != SAMPLE_DIGEST and len(computed) == 2


def test_a_memo_that_cannot_be_read_or_written_costs_only_the_time(tmp_path, monkeypatch):
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setattr(code_digest, "_memo", None)
    source = tmp_path / "kernel.py"
    source.write_text(SAMPLE)
    assert code_digest.code_digest(source) == SAMPLE_DIGEST
    monkeypatch.setenv("MATMUL_CACHE_DIR", str(tmp_path / "corrupt"))
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / code_digest.MEMO_FILE).write_text("{not json")
    monkeypatch.setattr(code_digest, "_memo", None)
    assert code_digest.code_digest(source) == SAMPLE_DIGEST
    assert json.loads((tmp_path / "corrupt" / code_digest.MEMO_FILE).read_text())  # written again, whole
