"""The KV capacity a real vLLM run had, read from what the run left: its log (vLLM v1's "GPU KV
cache size: N tokens", v0's "# GPU blocks: N") or a block count in its metadata."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.text_files import read_text

_V1_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_V0_BLOCKS = re.compile(r"#\s*(?:GPU|cuda) blocks:\s*([\d,]+)")
_METADATA_KEYS = ("num_gpu_blocks", "num_gpu_blocks_override")
_METADATA_SCOPES = ("", "kv_cache", "resolved_config.cache_config", "cache_config", "engine_kwargs")


@dataclass(frozen=True, slots=True)
class KvCapacityRecord:
    """A run's KV capacity as vLLM counted it (``num_gpu_blocks``, the null block included)
    and where it was read (``source``: a file and line, or a metadata key)."""

    num_gpu_blocks: int
    source: str

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise ValueError(
                f"KvCapacityRecord.num_gpu_blocks must be >= 2, got {self.num_gpu_blocks!r}"
            )


def kv_capacity_from_log(path: str | Path, block_size: int) -> KvCapacityRecord | None:
    """The first KV capacity a vLLM log states, or None when it states none. vLLM v1 logs the
    cache in tokens (blocks x block size, one KV cache group); v0 logs blocks."""
    path = Path(path)
    try:
        text = read_text(path, "vLLM log")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the vLLM log ({error.strerror or error})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if match := _V1_TOKENS.search(line):
            tokens = int(match.group(1).replace(",", ""))
            if tokens % block_size:
                raise ValueError(
                    f"{path}:{number}: {tokens} KV tokens is not a whole number of "
                    f"{block_size}-token blocks (--block-size of the run?)"
                )
            return KvCapacityRecord(tokens // block_size, f"{path}:{number}")
        if match := _V0_BLOCKS.search(line):
            return KvCapacityRecord(int(match.group(1).replace(",", "")), f"{path}:{number}")
    return None


def kv_capacity_from_metadata(meta: dict[str, Any], where: str) -> KvCapacityRecord | None:
    """A block count the run's metadata states, ``num_gpu_blocks`` (or an override of it) at
    its top level or in one of _METADATA_SCOPES (LLMServingSim's later runs record vLLM's
    ``kv_cache`` and ``resolved_config``)."""
    for scope_name in _METADATA_SCOPES:
        scope: Any = meta
        for part in scope_name.split(".") if scope_name else ():
            scope = scope.get(part) if isinstance(scope, dict) else None
        if not isinstance(scope, dict):
            continue
        for key in _METADATA_KEYS:
            value = scope.get(key)
            if value is None:
                continue
            field = f"{scope_name}.{key}" if scope_name else key
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{where}: field {field!r} must be an integer, got {value!r}")
            return KvCapacityRecord(value, f"{where} {field}")
    return None
