"""Every environment variable the package reads, in one table, each read through one typed accessor.

A knob is read at each use, not once at import, so a test or a script may set it late. A value that
does not parse is reported once on the ``matmul`` logger and the default is used instead: a typo in
a knob never stops a model.

``table()`` is the table ``matmul/call/README.md`` holds (``tests/test_knobs.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger("matmul")

TUNE_MODES = ("background", "blocking", "off")


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    default: str
    meaning: str
    parse: Callable[[str], object]

    def value(self):
        text = os.environ.get(self.name, "").strip()
        if not text:
            return self.parse(self.default)
        try:
            return self.parse(text)
        except ValueError as e:
            if (self.name, text) not in _reported:
                _reported.add((self.name, text))
                log.warning("%s=%s: %s; using the default %s", self.name, text, e, self.default or "(unset)")
            return self.parse(self.default)


_reported: set[tuple[str, str]] = set()


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower()
        if value not in allowed:
            raise ValueError(f"not one of {', '.join(allowed)}")
        return value

    return parse


def _non_negative(text: str) -> float:
    value = float(text)  # "inf" is a value: never stop waiting
    if math.isnan(value) or value < 0:
        raise ValueError("not a number of at least 0")
    return value


def _flag(text: str) -> bool:
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("not 1 or 0")


def _path(text: str) -> Optional[Path]:
    return Path(text).expanduser() if text else None


KNOBS = {
    knob.name: knob
    for knob in (
        Knob(
            "MATMUL_TUNE",
            "background",
            "background: a shape with no fresh choice runs an instant one (cuBLAS or a measured relative) while "
            "it is tuned in a child process; blocking: the call waits for its tuning and build (benchmarks); "
            "off: the instant choice is final",
            _choice(*TUNE_MODES),
        ),
        Knob(
            "MATMUL_LOG",
            "0",
            "1: log every decision of the call on stderr (which kernel runs a signature and why, builds, "
            "tunings): the logger `matmul.choices` at INFO",
            _flag,
        ),
        Knob(
            "MATMUL_CACHE_DIR",
            "",
            "where measured choices, the native entry and (unless TILUS_CACHE_DIR) built kernels are kept "
            "(default: $XDG_CACHE_HOME/tilus-matmul, else ~/.cache/tilus-matmul)",
            _path,
        ),
        Knob("XDG_CACHE_HOME", "", "the base of the default MATMUL_CACHE_DIR", _path),
        Knob(
            "TILUS_CACHE_DIR",
            "",
            "where tilus keeps built kernels (default: $MATMUL_CACHE_DIR/tilus when that is set, else tilus's own)",
            _path,
        ),
        Knob(
            "MATMUL_NATIVE_ENTRY",
            "1",
            "0: calls go through Python only (no C++ entry is built); for debugging",
            _flag,
        ),
        Knob(
            "MATMUL_TUNE_QUIET_MS",
            "50",
            "the tuning child times nothing until the process has made no call for this long (0: never wait)",
            _non_negative,
        ),
        Knob(
            "MATMUL_TUNE_MAX_HOLD_S",
            "5",
            "... but waits at most this long at a time (inf: no tuning while the process is busy)",
            _non_negative,
        ),
        Knob(
            "MATMUL_PLAN_QUIET_MS",
            "20",
            "the planner thread derives an unseen signature's plan once calls pause this long (0: at once)",
            _non_negative,
        ),
        Knob("MATMUL_PLAN_MAX_HOLD_MS", "1000", "... but waits at most this long at a time", _non_negative),
    )
}


def get(name: str):
    """The value of knob ``name`` now (parsed; the default where unset or unparsable)."""
    return KNOBS[name].value()


def tune_mode() -> str:
    return get("MATMUL_TUNE")


def log_decisions() -> bool:
    return get("MATMUL_LOG")


def native_entry() -> bool:
    return get("MATMUL_NATIVE_ENTRY")


def cache_dir() -> Path:
    """The package's cache folder (``MATMUL_CACHE_DIR``)."""
    explicit = get("MATMUL_CACHE_DIR")
    if explicit is not None:
        return explicit
    return (get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tilus-matmul"


def tilus_cache_base() -> Optional[Path]:
    """Where tilus's cache goes: ``TILUS_CACHE_DIR``, else under ``MATMUL_CACHE_DIR`` when that is set,
    else None (tilus's own default)."""
    explicit = get("TILUS_CACHE_DIR")
    if explicit is not None:
        return explicit
    return cache_dir() / "tilus" if get("MATMUL_CACHE_DIR") is not None else None


def table() -> str:
    """The knobs as a markdown table: name, default, meaning."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{k.name}` | `{k.default or '(unset)'}` | {k.meaning} |" for k in KNOBS.values()]
    return "\n".join(rows)


# --- the decision log ----------------------------------------------------------------------------

decisions = logging.getLogger("matmul.choices")
_handler: Optional[logging.Handler] = None


def apply_logging() -> None:
    """Send ``matmul.choices`` to stderr at INFO while ``MATMUL_LOG`` is on (called when ``matmul`` is
    imported; call again after changing the variable)."""
    global _handler
    if log_decisions() and _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("matmul: %(message)s"))
        decisions.addHandler(_handler)
        decisions.setLevel(logging.INFO)
    elif not log_decisions() and _handler is not None:
        decisions.removeHandler(_handler)
        decisions.setLevel(logging.NOTSET)
        _handler = None
