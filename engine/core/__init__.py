"""Shared serving core: request state, KV block allocators, scheduler, policies (stdlib only).

With ``SERVESIM_CORE=compiled`` in the environment, the modules come from a mypyc build of these
same sources (``python -m sim compile-core``; see ``engine.core.compiled``).
"""

import os as _os

if _os.environ.get("SERVESIM_CORE", "python").strip().lower() not in ("", "python"):
    from engine.core import compiled as _compiled

    if _compiled.mode() == "compiled":
        _compiled.activate(__path__, __name__)
