"""Where ``matmul()`` remembers which version and configuration won for a shape, across processes.

tilus's own cache (``tilus.option.cache_dir``)
    The built kernels and tilus's autotuning results. Importing ``matmul`` points it, once and never
    later (a kernel built in one cache would be built again in another), to a folder of
    ``$TILUS_CACHE_DIR``, else of ``$MATMUL_CACHE_DIR/tilus``, else of tilus's default, named after
    tilus's release and the package's fixes of its code generator (``tilus_fixes_key``): tilus keys a
    program by its IR and build options alone, so a fix that changes only the generated code would
    otherwise leave every kernel built before it, a mended fault included, in use.
``choices.json`` in ``$MATMUL_CACHE_DIR`` (else ``$XDG_CACHE_HOME/tilus-matmul``, ``~/.cache/tilus-matmul``)
    Per (architecture, GPU, dtype, shape bucket) the winning version and configuration, with the
    timings that decided it: ``{"format": 1, "tilus": ..., "entries": {"sm_90a/<gpu>/float16/
    4096x4096x4096": {"version": "v5", "config": {...}, "ms": ..., "fingerprint": ...}}}``.
The shipped table (``ShippedTable``, ``shipped/*.json``)
    The same entries, tuned on the project's GPUs, with the command, date and machine that made them
    (``write_shipped``; ``python -m matmul tune --out``); read before any tuning. Whether an entry may
    run here is ``chooser.Chooser``'s question.

Readers never lock (the file is replaced atomically); writers read-modify-replace under
``choices.json.lock``; tuning a key holds a per-key lock (``locks/``), so a second process waiting
for the shape reads the first one's result. A file that does not parse, or of another format or
tilus release, is ignored (with a warning, for a shipped one) and rewritten by the next store; an
entry the caller's ``is_valid`` rejects is tuned again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import filelock
import tilus

from .. import knobs

log = logging.getLogger(__name__)

FORMAT = 1
Entry = dict[str, Any]


def default_dir() -> Path:
    return knobs.cache_dir()


def tilus_fix_sources() -> list[Path]:
    """The files of ``matmul/tilus_fixes/``'s patches of tilus's code generator, in the order they are
    applied (which stacks them): every kernel's build goes through them, so they name the tilus
    cache folder and are part of every stored choice's fingerprint (``tuner.fingerprint_files``).
    Fixes of how a kernel is built or loaded, not of its code (``CHANGES_GENERATED_CODE = False``:
    a lock, a file renamed once complete), are left out: a change to them neither rebuilds every
    kernel nor makes a shipped table stale."""
    from .. import tilus_fixes

    return [Path(m.__file__) for m in tilus_fixes.MODULES if getattr(m, "CHANGES_GENERATED_CODE", True)]


def tilus_fixes_key() -> str:
    """The name of the tilus cache folder for this tilus release and these fixes of its code
    generator (the files of ``tilus_fix_sources()``, by name, order and code: ``code_digest``, so
    an edit to a comment or a docstring of a fix keeps the folder): a change to either builds every
    kernel again, in a folder of its own."""
    from .code_digest import code_digest

    digest = hashlib.sha256(tilus.__version__.encode())
    for path in tilus_fix_sources():
        digest.update(path.name.encode() + b"\0" + code_digest(path).encode())
    return f"fixes-{digest.hexdigest()[:12]}"


def tilus_cache_from_env() -> None:
    """Point tilus's cache to the folder ``tilus_fixes_key()`` of ``$TILUS_CACHE_DIR`` if set, else of
    ``$MATMUL_CACHE_DIR/tilus`` if that is set, else of tilus's default (called once, when
    ``matmul`` is imported). tilus 0.2.0 registers TILUS_CACHE_DIR but never reads it, so it is
    applied here."""
    base = knobs.tilus_cache_base() or Path(tilus.option.get_option("cache_dir")).expanduser()
    path = base / tilus_fixes_key()
    path.mkdir(parents=True, exist_ok=True)
    tilus.option.cache_dir(path)


class ChoiceCache:
    def __init__(self, root: Optional[Path] = None):
        self.root = Path(root or default_dir())
        self.path = self.root / "choices.json"
        # the entries as last read or written, and the digest of the file's bytes they came from:
        # parsed again only when the file changes. json.loads holds the GIL for the whole parse (a
        # few ms for a few hundred tuned buckets), and every lookup of an unseen call's plan, on
        # the planner's thread, would otherwise make the caller's calls wait for one; reading the
        # file and hashing it release the GIL.
        self._read: Optional[tuple[bytes, dict[str, Entry]]] = None

    # --- reading ---------------------------------------------------------------------------------

    def entries(self) -> dict[str, Entry]:
        """Every stored entry; {} for a missing, corrupt or stale file (it is rebuilt on the next store)."""
        return dict(self.read()[1])

    def read(self) -> tuple[Optional[bytes], dict[str, Entry]]:
        """The digest of the file's bytes (None: no file to read) and its entries, the dict kept
        from the last parse itself (not to be changed): what an index of the entries is made from
        again only when the digest changes."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None, {}
        except OSError as e:
            log.warning("ignoring the unreadable choice cache %s (%s); it will be rebuilt", self.path, e)
            return None, {}
        digest = hashlib.sha1(raw).digest()
        if self._read is None or self._read[0] != digest:
            self._read = (digest, self._parse(raw))
        return self._read

    def _parse(self, raw: bytes) -> dict[str, Entry]:
        try:
            data = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as e:
            log.warning("ignoring the unreadable choice cache %s (%s); it will be rebuilt", self.path, e)
            return {}
        if not (isinstance(data, dict) and isinstance(data.get("entries"), dict)):
            log.warning("ignoring the choice cache %s: not a choice file; it will be rebuilt", self.path)
            return {}
        if data.get("format") != FORMAT or data.get("tilus") != tilus.__version__:
            log.warning(
                "ignoring the choice cache %s: written for format %s and tilus %s (now %s and %s); it will be rebuilt",
                self.path,
                data.get("format"),
                data.get("tilus"),
                FORMAT,
                tilus.__version__,
            )
            return {}
        return data["entries"]

    def lookup(self, key: str, is_valid: Callable[[Entry], bool] = lambda e: True) -> Optional[Entry]:
        entry = self.entries().get(key)
        if entry is None:
            return None
        try:
            valid = isinstance(entry, dict) and is_valid(entry)
        except Exception:  # a malformed entry must not take the call down: tune again instead
            valid = False
        if not valid:
            log.warning("the stored choice for %s is stale or malformed; tuning again", key)
            return None
        return entry

    # --- writing ---------------------------------------------------------------------------------

    def store(self, key: str, entry: Entry) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.path) + ".lock"):
            entries = self.entries()
            entries[key] = entry
            text = json.dumps({"format": FORMAT, "tilus": tilus.__version__, "entries": entries}, indent=1)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".choices-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, self.path)  # atomic: a reader sees the old file or the new one
                self._read = (hashlib.sha1(text.encode()).digest(), entries)  # read back without parsing
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    @contextlib.contextmanager
    def tuning(self, keys: list[str]):
        """Hold the tuning locks of ``keys`` (in a fixed order, so two processes cannot deadlock):
        a second process that needs one of them waits, then finds the first one's result stored."""
        lock_dir = self.root / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            for key in sorted(set(keys)):
                held.enter_context(
                    filelock.FileLock(str(lock_dir / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".lock")))
                )
            yield

    def choose(self, key: str, tune: Callable[[], Entry], is_valid: Callable[[Entry], bool] = lambda e: True) -> Entry:
        """The stored entry for ``key`` if valid, else ``tune()``'s, stored. Only one process tunes a key."""
        entry = self.lookup(key, is_valid)
        if entry is not None:
            return entry
        with self.tuning([key]):
            entry = self.lookup(key, is_valid)  # another process may have tuned it while we waited
            if entry is None:
                entry = tune()
                self.store(key, entry)
        return entry


# --- the shipped table ---------------------------------------------------------------------------

SHIPPED_DIR = Path(__file__).with_name("shipped")


class ShippedTable:
    """The choices shipped with the package (every ``*.json`` of ``SHIPPED_DIR``, or ``paths``),
    read once, when first asked. Entries are keyed as in ``choices.json`` (the GPU's name is part
    of the key, so one table per GPU can lie side by side); a file that does not parse or is not a
    choice table is ignored with a warning, never an error."""

    def __init__(self, paths: Optional[Iterable[Path]] = None):
        self.paths = None if paths is None else [Path(p) for p in paths]
        self._entries: Optional[dict[str, Entry]] = None

    def entries(self) -> dict[str, Entry]:
        if self._entries is None:
            paths = sorted(SHIPPED_DIR.glob("*.json")) if self.paths is None else self.paths
            found: dict[str, Entry] = {}
            for path in paths:
                found.update(read_shipped(path))
            self._entries = found
        return self._entries


def read_shipped(path: Path) -> dict[str, Entry]:
    """The entries of one shipped table; {} (with a warning) for one that is missing or corrupt."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        log.warning("ignoring the shipped choice table %s: it does not parse (%s)", path, e)
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != FORMAT:
        log.warning("ignoring the shipped choice table %s: not a choice table of format %s", path, FORMAT)
        return {}
    return {key: entry for key, entry in entries.items() if isinstance(entry, dict)}


def write_shipped(path: Path, entries: dict[str, Entry], command: str, machine: dict[str, Any]) -> None:
    """Write a shipped table: ``entries`` (as ``choices.json`` holds them) with the ``command`` that
    measured them, today's date and the ``machine`` (GPU, driver, torch, CUDA). A table extended or
    resumed by another command keeps the earlier ones too (``commands``, in order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        earlier = json.loads(path.read_text())
        commands = earlier.get("commands") or [earlier["command"]]
    except (OSError, ValueError, KeyError, AttributeError):
        commands = []
    data = {
        "format": FORMAT,
        "tilus": tilus.__version__,
        "command": command,
        "commands": [*(c for c in commands if c != command), command],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "entries": dict(sorted(entries.items())),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


tilus_cache_from_env()
