"""The real engine: a Llama-family model on our kernels, driven by the shared core.

``from engine import LLM, SamplingParams`` is the offline API (vLLM's convention);
``python -m engine run TRACE ...`` replays a trace. Importing this package loads torch.
"""

from engine.llm import LLM, CompletionOutput, RequestOutput
from engine.llm_engine import EngineConfig, LLMEngine
from engine.sampling import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
