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
    # (module, attribute name, the original, whether the module held it itself rather than inheriting it)
    originals: list[tuple[object, str, object, bool]] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return bool(self.originals)

    def apply(self) -> None:
        if self.applied:
            return
        for module, attr, make in self.patches:
            # the attribute as stored (a class's staticmethod stays one when it is put back)
            own = attr in vars(module)
            original = vars(module)[attr] if own else getattr(module, attr)
            self.originals.append((module, attr, original, own))
            setattr(module, attr, make(original))

    def revert(self) -> None:
        for module, attr, original, own in reversed(self.originals):
            if own:
                setattr(module, attr, original)
            else:  # an inherited method: the class inherits it again
                delattr(module, attr)
        self.originals.clear()


def sm_major() -> int:
    """The major compute capability of the architecture tilus is building for."""
    return tilus.target.get_current_target().properties.compute_capability[0]
