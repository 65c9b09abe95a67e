"""Importing the modules that drive the real engine from a command's handler: without torch
installed, the command says how to install it instead of ending in a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

ENGINE_PACKAGES = ("torch", "triton", "safetensors")


@contextmanager
def needs_engine(command: str) -> Iterator[None]:
    """Wrap the imports of ``command``'s engine-side modules."""
    try:
        yield
    except ModuleNotFoundError as error:
        if error.name not in ENGINE_PACKAGES:
            raise
        raise ValueError(
            f"{command} runs the real engine, which needs {error.name}: "
            'pip install torch==2.13.0 -e ".[engine]"'
        ) from None
