"""One work-around for one fault of tilus: the attributes it replaces, and how to take it out again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import tilus


@dataclass
class Fix:
    name: str
    fault: str
    # (module, attribute name, replacement factory taking the original)
    patches: list[tuple[object, str, Callable]] = field(default_factory=list)
    originals: list[tuple[object, str, object]] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return bool(self.originals)

    def apply(self) -> None:
        if self.applied:
            return
        for module, attr, make in self.patches:
            # the attribute as stored (a class's staticmethod stays one when it is put back)
            original = vars(module)[attr] if attr in vars(module) else getattr(module, attr)
            self.originals.append((module, attr, original))
            setattr(module, attr, make(original))

    def revert(self) -> None:
        for module, attr, original in reversed(self.originals):
            setattr(module, attr, original)
        self.originals.clear()


def sm_major() -> int:
    """The major compute capability of the architecture tilus is building for."""
    return tilus.target.get_current_target().properties.compute_capability[0]
