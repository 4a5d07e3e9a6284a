"""The public call ``matmul(a, b)`` (``api``), its per-call launch path (``launch``), the tuner that
picks a kernel per shape bucket in a child process (``tuner``), the on-disk store of those picks
(``choice_cache``), the use of tilus's own per-version autotuning (``tilus_autotune``), and the
torch custom operators for ``torch.compile`` and autograd (``torch_op``)."""
