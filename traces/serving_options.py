"""The serving options that ``python -m sim run`` and ``python -m engine run`` share (trace,
policy, KV memory, budgets, preemption, prefix caching, SLOs, outputs): one definition of each
flag, its type and its help, below both command lines (the engine may not import ``sim``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from core.config import PARALLEL_SAMPLING, SchedulerConfig
from traces.loaders import FORMATS
from traces.options import fraction, non_negative_float, positive_float, positive_int
from traces.rows import ON_ERROR_CHOICES

HelpOverrides = Mapping[str, str]
"""Help text by flag (``"--num-blocks"``) or positional name (``"trace"``), where a command line
words an option for its own executor."""


class SchedulingDefaults(Protocol):
    """The defaults the scheduling options show: `sim.run.RunConfig` and
    `engine.llm_engine.EngineConfig` both have these fields."""

    @property
    def block_size(self) -> int: ...
    @property
    def gpu_memory_utilization(self) -> float: ...
    @property
    def swap_space_gib(self) -> float: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def max_wait_s(self) -> float: ...
    @property
    def preemption_mode(self) -> str: ...


class _Options:
    """Adds arguments to one parser, taking each help text from the overrides when given, and
    refuses overrides for flags it never added (a misspelt flag must not pass silently)."""

    def __init__(self, parser: argparse.ArgumentParser, help: HelpOverrides | None) -> None:
        self.parser = parser
        self.help = dict(help or {})
        self.added: set[str] = set()

    def add(self, name: str, help: str, **kwargs: Any) -> None:
        self.added.add(name)
        self.parser.add_argument(name, help=self.help.get(name, help), **kwargs)

    def check(self) -> None:
        unknown = sorted(set(self.help) - self.added)
        if unknown:
            raise ValueError(f"help overrides name options that were not added: {unknown}")


def add_trace_arguments(
    parser: argparse.ArgumentParser, help: HelpOverrides | None = None, check_format: bool = True
) -> None:
    """``TRACE``, ``--format`` and ``--on-error``. `check_format` False leaves the format name
    to the trace loader instead of argparse's choices."""
    options = _Options(parser, help)
    options.add(
        "trace",
        help="trace file (servesim CSV, Vidur CSV, Azure CSV, Mooncake JSONL, BurstGPT CSV)",
    )
    options.add(
        "--format",
        default="auto",
        choices=["auto", *sorted(FORMATS)] if check_format else None,
        help="trace format (default: detect from the header)",
    )
    options.add(
        "--on-error",
        default="raise",
        choices=ON_ERROR_CHOICES,
        help="bad trace rows: raise fails listing every one (file, line, field); skip leaves "
        "them out and the summary counts them (default: %(default)s)",
    )
    options.check()


def add_policy_argument(
    parser: argparse.ArgumentParser, choices: Sequence[str], default: str
) -> None:
    """``--policy``, over the policies the executor offers."""
    parser.add_argument(
        "--policy",
        default=default,
        choices=choices,
        help="batching policy (default: %(default)s)",
    )


def add_scheduling_arguments(
    parser: argparse.ArgumentParser,
    defaults: SchedulingDefaults,
    preemption_modes: Sequence[str],
    help: HelpOverrides | None = None,
) -> None:
    """The KV cache size, the step budgets, preemption, prefix caching and the length limit:
    ``--block-size`` through ``--max-model-len``."""
    options = _Options(parser, help)
    options.add(
        "--block-size",
        type=positive_int,
        default=defaults.block_size,
        help="KV block size in tokens (default: %(default)s)",
    )
    options.add(
        "--num-blocks",
        type=positive_int,
        default=None,
        help=(
            "KV blocks per replica, counted as vLLM's num_gpu_blocks: paged memory keeps one "
            "as the null block (default: derived from GPU memory, as vLLM does)"
        ),
    )
    options.add(
        "--gpu-memory-utilization",
        type=fraction,
        default=defaults.gpu_memory_utilization,
        help="share of GPU memory the engine may use (default: %(default)s)",
    )
    options.add(
        "--swap-space-gib",
        type=non_negative_float,
        default=defaults.swap_space_gib,
        help="CPU swap space per replica in GiB (default: %(default)s)",
    )
    options.add(
        "--max-num-seqs",
        type=positive_int,
        default=defaults.max_num_seqs,
        help="max sequences per step (default: %(default)s)",
    )
    options.add(
        "--max-batch-tokens",
        type=positive_int,
        default=defaults.max_num_batched_tokens,
        help="token budget per step (default: %(default)s)",
    )
    options.add(
        "--batch-size",
        type=positive_int,
        default=defaults.batch_size,
        help="static/dynamic batch size B (default: %(default)s)",
    )
    options.add(
        "--max-wait-s",
        type=non_negative_float,
        default=defaults.max_wait_s,
        help="dynamic batching: start a batch once the oldest has waited this long "
        "(default: %(default)s)",
    )
    options.add(
        "--preemption",
        choices=preemption_modes,
        default=defaults.preemption_mode,
        help="preemption mode (default: %(default)s)",
    )
    options.add(
        "--parallel-sampling",
        choices=PARALLEL_SAMPLING,
        default=SchedulerConfig().parallel_sampling,
        help="n > 1 samples: fan_out, n child requests each scheduled on its own (vLLM v1), or "
        "fork, the prompt's KV shared copy-on-write (the vLLM paper, vLLM v0) "
        "(default: %(default)s)",
    )
    options.add(
        "--prefix-caching", action="store_true", help="enable prefix caching (paged memory)"
    )
    options.add(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="max tokens per request (default: the model's)",
    )
    options.check()


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    """``--slo-ttft`` and ``--slo-tpot`` in ms; `slo_s` turns them into the configs' seconds."""
    parser.add_argument(
        "--slo-ttft", type=positive_float, default=None, help="TTFT SLO in ms for goodput"
    )
    parser.add_argument(
        "--slo-tpot", type=positive_float, default=None, help="TPOT SLO in ms for goodput"
    )


def slo_s(slo_ms: float | None) -> float | None:
    """An ``--slo-*`` value in seconds; None (no SLO) stays None."""
    return None if slo_ms is None else slo_ms / 1000.0


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``, where a run writes its records."""
    parser.add_argument(
        "--out", default=None, help="write requests.csv, steps.csv, summary.json here"
    )


def add_report_and_quiet_arguments(
    parser: argparse.ArgumentParser, help: HelpOverrides | None = None
) -> None:
    """``--report FILE`` and ``--quiet``."""
    options = _Options(parser, help)
    options.add("--report", default=None, help="write a self-contained HTML report to this file")
    options.add("--quiet", action="store_true", help="no progress bar, no table")
    options.check()
