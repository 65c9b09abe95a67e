"""Discrete-event simulator of LLM serving: the SimPy replica and deployments around the core,
the cost model that prices each step, fast-forward, and the ``python -m sim`` command line."""
