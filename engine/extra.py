"""The packages the engine needs beyond the simulator's (the ``engine`` extra), and what to
tell a user who lacks one. Standard library only: it runs before torch can be imported."""

from __future__ import annotations

ENGINE_EXTRA = ("torch", "safetensors")  # imported as the engine loads; triton when a kernel runs
INSTALL = 'pip install torch==2.13.0 -e ".[engine]"'


class EngineExtraMissingError(ModuleNotFoundError):
    """A package of the ``engine`` extra is not installed."""


def missing_message(name: str) -> str:
    return (
        f"the engine needs {name}, which is not installed; install the engine extra from the "
        f"project's folder: {INSTALL} (torch pinned, so that pip does not pull a CUDA build)"
    )
