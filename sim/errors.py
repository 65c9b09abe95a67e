"""The simulator's exceptions, kept apart from the modules a compiled build compiles (mypyc
cannot compile a class derived from a built-in exception; see sim.compiled.build)."""


class SimulationError(RuntimeError):
    """The simulated system cannot make progress (a bug, never an expected outcome)."""
