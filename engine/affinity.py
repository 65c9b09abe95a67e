"""Which CPU cores the engine's process runs on (``python -m engine run --cpu-cores``).

An eager engine's steps are its host's: on the H200 machine its decode steps ran in two speeds
(12.6-13.4 ms and 18.6-24.7 ms at 1-32 sequences), in stretches of tens to hundreds of steps,
with the steps' input preparation (pure Python) 1.3-1.6 times slower in the slow ones too. So
the whole host slowed down for stretches, as a process moved to a slower or shared core would.
Pinning the process to cores of its own is the A/B that tells (gpu-check's
``engine-pinned-eager`` part)."""

from __future__ import annotations

import os


def parse_cores(spec: str) -> frozenset[int]:
    """Cores from ``"2"``, ``"2,3"`` or ``"2-5"`` (ranges and commas together); a ValueError
    naming the flag for anything else."""
    cores: set[int] = set()
    for part in spec.split(","):
        text = part.strip()
        low, dash, high = text.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(
                f"--cpu-cores: {text!r} is not a core number or a range like 2-5 (got {spec!r})"
            ) from None
        if first < 0 or last < first:
            raise ValueError(f"--cpu-cores: {text!r} is not a range of cores >= 0 (got {spec!r})")
        cores.update(range(first, last + 1))
    return frozenset(cores)


def pin_to_cores(cores: frozenset[int]) -> tuple[int, ...]:
    """Restrict this process's calling thread, and every thread it starts afterwards (they
    inherit its mask: call this before the engine starts torch's), to ``cores``, which must
    all be among the cores it may use now. Returns the cores it now runs on."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("--cpu-cores: this platform cannot pin a process to cores")
    allowed = os.sched_getaffinity(0)
    missing = sorted(cores - allowed)
    if missing:
        raise ValueError(
            f"--cpu-cores: core(s) {', '.join(map(str, missing))} not available to this "
            f"process (it may use {_ranges(allowed)})"
        )
    os.sched_setaffinity(0, cores)
    return tuple(sorted(os.sched_getaffinity(0)))


def current_cores() -> tuple[int, ...] | None:
    """The cores this process may run on now, where the platform says."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def _ranges(cores: set[int] | frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    out: list[str] = []
    for core in sorted(cores):
        if out and "-" not in out[-1] and int(out[-1]) == core - 1:
            out[-1] = f"{out[-1]}-{core}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == core - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{core}"
        else:
            out.append(str(core))
    return ",".join(out)
