"""The run records every executor writes and every reader reads: the ``requests.csv`` /
``steps.csv`` columns and their writers (``schema``), the metric definitions (``metrics``: TTFT,
TPOT, ITL, E2E, goodput) and the run directory's writer and loader (``run_dir``).

It sits below ``sim/``, ``engine/`` and ``reports/``: it imports only ``engine.core`` (standard
library) and pandas/numpy, never the simulator, the engine's torch side or the reports.

With ``SERVESIM_CORE=compiled``, ``schema`` and ``step_shapes`` come from a mypyc build of these
same sources (``python -m sim compile-core``; see ``engine.core.compiled``).
"""

import os as _os

if _os.environ.get("SERVESIM_CORE", "python").strip().lower() not in ("", "python"):
    from engine.core import compiled as _compiled

    if _compiled.mode() == "compiled":
        _compiled.activate(__path__, __name__)
