"""The real engine: a Llama-family model on our kernels, driven by the shared core.

``from engine import LLM, SamplingParams`` is the offline API (vLLM's convention);
``python -m engine run TRACE ...`` replays a trace. Importing this package loads torch; where
torch (or another package of the ``engine`` extra) is missing, the package still imports, so
that ``python -m engine`` can say what to install, and its names raise
``EngineExtraMissingError`` saying the same.
"""

from engine.extra import ENGINE_EXTRA, EngineExtraMissingError, missing_message

MISSING_EXTRA: str | None = None
try:
    from engine.llm import LLM, CompletionOutput, RequestOutput
    from engine.llm_engine import EngineConfig, LLMEngine
    from engine.sampling import SamplingParams
except ModuleNotFoundError as error:
    if error.name not in ENGINE_EXTRA:
        raise
    MISSING_EXTRA = error.name

    def __getattr__(name: str) -> object:
        if name in __all__:
            raise EngineExtraMissingError(missing_message(str(MISSING_EXTRA)))
        raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
