"""The run records every executor writes and every reader reads: the ``requests.csv`` /
``steps.csv`` columns and their writers (``schema``), the metric definitions (``metrics``: TTFT,
TPOT, ITL, E2E, goodput) and the run directory's writer and loader (``run_dir``).

It sits below ``sim/``, ``engine/`` and ``reports/``: it imports only ``core`` (standard
library) and pandas/numpy, never the simulator, the engine or the reports.
"""
