"""The harness: checks and times every version against cuBLAS (``bench``), the results' record and
file format (``results``), the shape presets (``presets``), the Triton baseline
(``triton_baseline``) and the figures (``plot``)."""
