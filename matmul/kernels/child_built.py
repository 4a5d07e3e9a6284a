"""The kernels of one family outside the series (swiglu's activation, ``kernels.swiglu``; the
widening of a packed weight, ``quant.widen``) as the call builds them: by its build child, never
on a thread of the caller (``matmul.call.building``). One ``ChildBuilt`` per family holds which
of its kernels are built, building or failed, keyed by the family's key (swiglu: dtype and
direction; widen: dtype and format).

``launch(key)`` returns the built kernel's launch function, or None while it is not: the first
such call starts its build, once, through the builder the call installed (``set_builder``), and
the family's torch path runs meanwhile, and for good after a failed build (with a warning). With
no builder installed nothing is built and torch's path always runs.
"""

import logging
import threading
from typing import Callable, Hashable, Optional

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

    def launch(self, key):
        """The built kernel of ``key``, or None (torch's path) while it builds (its build started here
        if it has not), where it did not build, or where no builder is installed."""
        builder = self.builder
        if builder is None:
            return None
        with self._lock:
            if key in self.launches:
                return self.launches[key]
            if key in self.building or key in self.failed:
                return None
            self.building.add(key)
        builder(key, self._on_ready, self._on_failed)
        return None

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
