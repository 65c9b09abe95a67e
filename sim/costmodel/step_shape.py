"""`StepShape`: what the cost model needs to know about one engine step, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepShape:
    """What the cost model needs to know about one engine step.

    `prefill_chunks` holds (num_new_tokens, num_context_tokens_before_chunk) per prefilling
    sequence; `decode_context_tokens` the context length, including the new token, per decoding
    sequence. Padding tokens (static batching) pass through the linear layers for nothing.
    Blocks are the cost model's own size (its ``block_size``, given when it is built).
    """

    prefill_chunks: tuple[tuple[int, int], ...] = ()
    decode_context_tokens: tuple[int, ...] = ()
    num_padding_tokens: int = 0
    num_copy_blocks: int = 0
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0

    def __post_init__(self) -> None:
        # Kept cheap (min() runs in C): the simulator builds one of these per step.
        for num_new_tokens, num_context_tokens in self.prefill_chunks:
            if num_new_tokens <= 0 or num_context_tokens < 0:
                raise ValueError(
                    "StepShape.prefill_chunks needs num_new_tokens > 0 and context >= 0, got "
                    f"{(num_new_tokens, num_context_tokens)!r}"
                )
        if self.decode_context_tokens and min(self.decode_context_tokens) <= 0:
            raise ValueError(
                "StepShape.decode_context_tokens must all be positive, got "
                f"{min(self.decode_context_tokens)!r}"
            )
        for field in (
            "num_padding_tokens",
            "num_copy_blocks",
            "num_swap_out_blocks",
            "num_swap_in_blocks",
        ):
            if getattr(self, field) < 0:
                raise ValueError(f"StepShape.{field} must be >= 0, got {getattr(self, field)!r}")

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk[0] for chunk in self.prefill_chunks)

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_context_tokens)

    @property
    def num_batched_tokens(self) -> int:
        """Scheduled tokens (prefill + decode); padding is not counted."""
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_chunks) + len(self.decode_context_tokens)
