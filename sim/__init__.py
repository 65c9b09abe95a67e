"""Discrete-event simulator of LLM serving: SimPy model, deployments, cost model, CLI.

With ``SERVESIM_CORE=compiled``, the step loop's modules come from a mypyc build of these same
sources (``python -m sim compile-core``; see ``engine.core.compiled``).
"""

import os as _os

if _os.environ.get("SERVESIM_CORE", "python").strip().lower() not in ("", "python"):
    from engine.core import compiled as _compiled

    if _compiled.mode() == "compiled":
        _compiled.activate(__path__, __name__)
