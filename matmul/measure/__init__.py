"""What checking and timing a kernel needs, shared by the tuner and the harness: random operands,
the float32 reference and tolerances (``correctness``), and the timers (``timing``)."""
