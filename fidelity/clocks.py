"""Which clock times the engine's CPU work in calibration and validation (``--clock``)."""

from __future__ import annotations

CLOCK_CHOICES = ("auto", "wall", "cpu")
CLOCK_HELP = (
    "how CPU time is measured: cpu = the engine thread's CPU time (time.thread_time), which a "
    "loaded machine's waits for a core do not inflate; wall = the wall clock; auto = cpu on a "
    "CPU device with one torch thread, wall otherwise (a GPU always times with CUDA events "
    "and runs on the wall clock)"
)


def resolve_clock(clock: str, device: str, cpu_threads: int) -> str:
    """``auto`` is ``cpu`` on a CPU device with one torch thread, else ``wall``."""
    if clock not in CLOCK_CHOICES:
        raise ValueError(f"clock must be one of {CLOCK_CHOICES}, got {clock!r}")
    if clock != "auto":
        return clock
    return "cpu" if device == "cpu" and cpu_threads == 1 else "wall"
