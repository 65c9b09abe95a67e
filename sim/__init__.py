"""Discrete-event simulator of LLM serving: SimPy model, deployments, cost model, CLI."""
