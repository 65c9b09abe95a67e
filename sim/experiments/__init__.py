"""Experiments of many runs: sweeps over a grid of configurations (``sweep``, ``sweep_spec``)
and the capacity search for the highest arrival rate that meets SLOs (``capacity``)."""
