"""What the matmul versions share: the ``Pipeline`` class and the tile schedulers.

Importing this package applies the tilus 0.2.0 work-arounds (``pipeline.tilus_fixes``) first, so
every kernel built through the project builds the same way on every machine.
"""

from .tilus_fixes import apply_all as _apply_tilus_fixes

_apply_tilus_fixes()

from .pipeline import Pipeline  # noqa: E402
from .schedulers import TileRasterizer, grouped_tile, grouped_tile_order  # noqa: E402

__all__ = ["Pipeline", "TileRasterizer", "grouped_tile", "grouped_tile_order"]
