"""The kernels of one family that the call launches itself, outside the series it tunes (swiglu's
activation, ``kernels.swiglu``; the widening of a packed weight, ``quant.widen``; Hopper V8 on a
packed weight, ``quant.linear``) as the call builds them: by its build child, never on a thread of
the caller (``matmul.call.building``). One ``ChildBuilt`` per family holds which of its kernels
are built, building or failed, keyed by the family's key (swiglu: dtype and direction; widen:
dtype and format; V8: dtype, format and configuration).

``launch(key)`` returns the built kernel's launch function, or None while it is not: the first
such call starts its build, once, through the builder the call installed (``set_builder``), and
the family's fallback path runs meanwhile (torch's; V8's: the weight widened for cuBLAS), and for
good after a failed build (with a warning). With no builder installed nothing is built and the
fallback always runs. Inside a CUDA graph capture nothing may start (``capturing``, the chooser's
rule): such a call passes ``start=False`` and gets the built kernel or None.
"""

import logging
import threading
import time
from typing import Callable, Hashable, Optional

import torch

# builder(key, on_ready, on_failed): starts the build of the kernel of key and returns at once,
# then calls on_ready(key, launch) or on_failed(key, reason) (from any thread)
Builder = Callable[[Hashable, Callable, Callable], None]


class ChildBuilt:
    """One family's kernels built by the call's build child. ``warning``: the message logged on
    ``log`` when a kernel does not build, a %-format of its key and the reason (it says which path
    runs instead)."""

    def __init__(self, log: logging.Logger, warning: str):
        self.log = log
        self.warning = warning
        self.launches: dict = {}  # key -> the built kernel's launch function
        self.building: set = set()  # keys whose build started and has not reported
        self.failed: set = set()  # keys whose build failed: never tried again
        self.builder: Optional[Builder] = None  # the call installs its build child's; none: torch's path
        self._lock = threading.Lock()

    def set_builder(self, builder: Optional[Builder]) -> None:
        """Build the kernels with ``builder`` from now on (see ``Builder``)."""
        self.builder = builder

    def launch(self, key, start: bool = True):
        """The built kernel of ``key``, or None (the fallback path) while it builds (its build started
        here if it has not, unless ``start`` is False), where it did not build, or where no builder is
        installed."""
        builder = self.builder
        if builder is None:
            return None
        with self._lock:
            if key in self.launches:
                return self.launches[key]
            if not start or key in self.building or key in self.failed:
                return None
            self.building.add(key)
        builder(key, self._on_ready, self._on_failed)
        return None

    def wait(self, key, timeout_s: float) -> bool:
        """Start the build of ``key`` if it has not started, and wait for it (tests, benchmarks); False
        where no builder is installed, the build failed or did not finish within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:  # asked once even with no time left: a kernel built already is found
            if self.launch(key) is not None:
                return True
            if not self.is_building(key) or time.monotonic() >= deadline:
                return False  # no builder, the build failed, or it is not done in time
            time.sleep(0.1)

    def is_building(self, key=None) -> bool:
        """Whether the build of ``key`` (of any kernel of the family, without one) is under way."""
        with self._lock:
            return bool(self.building) if key is None else key in self.building

    def _on_ready(self, key, launch) -> None:
        with self._lock:
            self.launches[key] = launch
            self.building.discard(key)

    def _on_failed(self, key, reason: str) -> None:
        self.log.warning(self.warning, key, reason)
        with self._lock:
            self.failed.add(key)
            self.building.discard(key)


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA graph: then no build
    may start (as the chooser starts no tuning and no build then)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
