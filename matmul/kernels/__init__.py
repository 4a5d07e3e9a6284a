"""The kernels: ``hopper/`` and ``blackwell/`` hold the versions V0-V8 of each series, each the
previous one plus one idea, all on one entry point (``entry.MatmulKernel``; V8, whose weight comes
packed, on ``entry.PackedWeightKernel``); ``versions`` is the registry that finds, builds and runs
them."""
