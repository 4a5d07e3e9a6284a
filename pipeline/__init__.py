"""The device-side building blocks the matmul versions share: the ``Pipeline`` ring of mbarrier
stages, the tile schedulers (grouped rasterization, static persistent schedules, cluster launch
control), the transports between the CTAs of a cluster, the main loops and the epilogues (with a
fused variant's bias and activation, ``fused_epilogue``).

Nothing here patches tilus: ``matmul`` applies its tilus work-arounds (``matmul.tilus_fixes``)
when it is imported, before any kernel is built.
"""

from .clc import ClcScheduler
from .pipeline import Pipeline
from .schedulers import TileRasterizer, grouped_tile, grouped_tile_order
from .tma_store import StagedTmaStore

__all__ = ["ClcScheduler", "Pipeline", "StagedTmaStore", "TileRasterizer", "grouped_tile", "grouped_tile_order"]
