"""The public call ``matmul(a, b)``: its launch path (``api``), the tuner that picks a kernel per
shape (``tuner``), the on-disk store of those picks (``choice_cache``), and the use of tilus's own
per-version autotuning (``tilus_autotune``)."""
