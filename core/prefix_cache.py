"""Content keys of full KV blocks, chained so a key names a block *and* everything before it.

A block's content is known from the prompt's token ids, from a trace's prefix-block hash ids
(Mooncake gives one id per 512 prompt tokens), or from the engine's sampled token ids. When
it is not known (a synthetic trace with lengths only) the block is named by its request, sample
and index, so it can only ever hit its own request again (after a recompute preemption), or, for
a prompt block, a sibling of a fanned-out request (``Request.prompt_idx``).
Keys are built from ints only, so Python's ``hash`` gives the same value in every process.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.request import Request

ROOT_KEY = 0x5EED


def chain_key(parent_key: int, content: tuple[int, ...]) -> int:
    """The key of a block holding ``content`` right after the block keyed ``parent_key``."""
    return hash((parent_key, content))


def block_content(
    request: Request, block_idx: int, block_size: int, sample_idx: int, output_ids: Sequence[int]
) -> tuple[int, ...]:
    """What identifies the tokens of block ``block_idx`` for one sample of ``request``."""
    start = block_idx * block_size
    end = start + block_size
    prompt_len = request.num_prompt_tokens
    if end <= prompt_len:
        if request.prompt_token_ids is not None:
            return tuple(request.prompt_token_ids[start:end])
        if request.prefix_hash_ids is not None:
            hb = request.hash_block_tokens
            first, last = start // hb, (end - 1) // hb
            if last < len(request.prefix_hash_ids):
                return (start % hb, *request.prefix_hash_ids[first : last + 1])
        owner = request.prompt_idx if request.prompt_idx >= 0 else request.internal_idx
        return (-1 - owner, -1, block_idx)
    if request.prompt_token_ids is not None and len(output_ids) >= end - prompt_len:
        tokens = list(request.prompt_token_ids[start:prompt_len]) if start < prompt_len else []
        tokens.extend(output_ids[max(0, start - prompt_len) : end - prompt_len])
        return tuple(tokens)
    return (-1 - request.internal_idx, sample_idx, block_idx)


class SequenceKeys:
    """Keys of one sequence's full blocks, extended as blocks fill up."""

    __slots__ = ("keys",)

    def __init__(self, keys: list[int] | None = None) -> None:
        self.keys: list[int] = keys if keys is not None else []

    def extend_to(
        self,
        num_full_blocks: int,
        request: Request,
        block_size: int,
        sample_idx: int,
        output_ids: Sequence[int],
    ) -> None:
        keys = self.keys
        while len(keys) < num_full_blocks:
            parent = keys[-1] if keys else ROOT_KEY
            content = block_content(request, len(keys), block_size, sample_idx, output_ids)
            keys.append(chain_key(parent, content))

    def copy(self) -> SequenceKeys:
        return SequenceKeys(list(self.keys))
