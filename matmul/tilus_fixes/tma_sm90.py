"""tilus 0.2.0 fault ``tma_sm90``: TMA loads for Hopper.

Every TMA global-to-shared copy is emitted with ``.cta_group::1``. That qualifier exists only
from sm_100 on; ptxas rejects it for sm_90a ("Feature '.cta_group::1' not supported on .target
'sm_90a'"), so no TMA load builds for Hopper. Below sm_100 the qualifier is dropped (it means
the default there); ``cta_group=2`` below sm_100 is refused with a clear error.
"""

from __future__ import annotations

import functools

from .fix import Fix, sm_major


def _drop_cta_group_below_sm100(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if sm_major() < 10:
            if kwargs.get("cta_group") not in (None, 1):
                raise ValueError("TMA with cta_group=2 needs sm_100 or newer; on Hopper use cta_group=1 (the default)")
            kwargs["cta_group"] = None
        return original(*args, **kwargs)

    return wrapper


def make() -> Fix:
    from tilus.backends.emitters.cuda import cp_async_tensor as emitter

    return Fix(
        name="tma_sm90",
        fault="TMA loads are emitted with .cta_group::1, which ptxas rejects for sm_90a",
        patches=[
            (emitter, "cp_async_tensor_global_to_shared", _drop_cta_group_below_sm100),
            (emitter, "cp_async_tensor_global_to_cluster_shared", _drop_cta_group_below_sm100),
        ],
    )
