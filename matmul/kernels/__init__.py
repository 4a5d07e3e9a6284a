"""The kernels: ``hopper/`` and ``blackwell/`` hold the versions V0-V6 of each series, each the
previous one plus one idea, all on one entry point (``entry.MatmulKernel``); ``versions`` is the
registry that finds, builds and runs them."""
