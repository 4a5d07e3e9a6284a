"""What the matmul versions share: the ``Pipeline`` class, the tile schedulers (grouped
rasterization, static persistent schedules, cluster launch control) and the epilogue/main-loop
pieces that more than one version uses.

Importing this package applies the tilus 0.2.0 work-arounds (``pipeline.tilus_fixes``) first, so
every kernel built through the project builds the same way on every machine.
"""

from .tilus_fixes import apply_all as _apply_tilus_fixes

_apply_tilus_fixes()

from .clc import ClcScheduler  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .schedulers import TileRasterizer, grouped_tile, grouped_tile_order  # noqa: E402
from .tma_store import StagedTmaStore  # noqa: E402

__all__ = ["ClcScheduler", "Pipeline", "StagedTmaStore", "TileRasterizer", "grouped_tile", "grouped_tile_order"]
