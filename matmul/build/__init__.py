"""Building kernels for a chosen architecture on any machine, and reading what they compiled to
(PTX, SASS, registers, spills, shared memory): ``compiler``."""

from .compiler import (
    SHARED_MEMORY_LIMIT,
    TARGETS,
    BuildResult,
    build_config,
    build_script,
    build_version,
    markers_found,
    normalized_ptx,
    target,
)

__all__ = [
    "SHARED_MEMORY_LIMIT",
    "TARGETS",
    "BuildResult",
    "build_config",
    "build_script",
    "build_version",
    "markers_found",
    "normalized_ptx",
    "target",
]
