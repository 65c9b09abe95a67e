"""The serving configuration both executors hold: `CacheConfig` (KV memory) and `SchedulerConfig`
(policy, budgets, preemption). Each setting's default is its field's; its flag type, help and
check are its row of `SETTINGS`, the one table every command line is generated from."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from core.errors import ConfigError

MemoryModel = Literal["paged", "contiguous"]
ReservationRule = Literal["max", "pow2", "oracle"]
PreemptionMode = Literal["recompute", "swap"]
ParallelSampling = Literal["fan_out", "fork"]
SchedulingPolicy = Literal["fcfs", "priority"]

MEMORY_MODELS: tuple[MemoryModel, ...] = ("paged", "contiguous")
RESERVATION_RULES: tuple[ReservationRule, ...] = ("max", "pow2", "oracle")
PREEMPTION_MODES: tuple[PreemptionMode, ...] = ("recompute", "swap")
GIB = 1 << 30
PARALLEL_SAMPLING: tuple[ParallelSampling, ...] = ("fan_out", "fork")
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")
"""How a request with n > 1 samples runs: ``fan_out``, as vLLM v1 runs it, n child requests
scheduled each on its own that share only through the prefix cache; ``fork``, as the vLLM paper
and vLLM v0 run it, the prompt computed once and its blocks shared copy-on-write by n
sequences that decode together (``core.parallel_sampling``)."""

# Field metadata of what is not a setting: no flag, not among a run's recorded settings.
NOT_A_SETTING = {"setting": False}
# The settings that choose a memory layout other than paged: an executor that runs paged memory
# only (the engine) takes every setting but these.
LAYOUT_SETTINGS = ("memory_model", "reservation")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How KV memory is laid out and handed out.

    ``paged`` memory is vLLM's PagedAttention: ``num_blocks`` blocks of ``block_size`` token
    slots, counted as vLLM's ``num_gpu_blocks``: one of them is vLLM's null block (a
    placeholder never handed to a request), so ``num_blocks - 1`` are usable.
    ``contiguous`` memory is the pre-paging baseline: ``num_blocks * block_size`` slots (it
    has no null block), but each sequence reserves one contiguous range sized by
    ``reservation`` (Orca's Max / Pow2 / Oracle).

    Three settings may be left to the executor (None): ``num_blocks`` (sized from device
    memory), ``memory_model`` (the executor's default for its policy) and ``max_model_len``
    (the model's). The executor fills them in once, with `resolve`, before it builds a
    `Scheduler`, which refuses a config with any of them still None. ``num_cpu_blocks`` is set
    there too, from ``swap_space_gib``.
    """

    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    swap_space_gib: float = 4.0
    memory_model: MemoryModel | None = None
    reservation: ReservationRule = "max"
    enable_prefix_caching: bool = False
    max_model_len: int | None = None
    # Host blocks that swapped-out KV goes to: `resolve` sizes it from ``swap_space_gib``.
    num_cpu_blocks: int = field(default=0, metadata=NOT_A_SETTING)
    # Fraction of blocks kept free when admitting new work while something runs, so running
    # requests can grow (vLLM's ``watermark``, default 0.0 as there). No flag offers it.
    watermark: float = field(default=0.0, metadata=NOT_A_SETTING)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.num_cpu_blocks < 0:
            raise ConfigError("num_cpu_blocks", f"must be >= 0, got {self.num_cpu_blocks!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark", f"must be in [0, 1), got {self.watermark!r}")
        if self.memory_model == "paged" and self.num_blocks is not None and self.num_blocks < 2:
            raise ConfigError(
                "num_blocks",
                f"must be >= 2 for paged memory (one is the null block), got {self.num_blocks!r}",
            )
        if self.enable_prefix_caching and self.memory_model == "contiguous":
            raise ValueError("enable_prefix_caching needs memory_model 'paged', not 'contiguous'")

    def resolve(
        self,
        scheduler: SchedulerConfig,
        size_blocks: Callable[[], int],
        block_bytes: int,
        memory_model: MemoryModel,
        model: tuple[str, int],
    ) -> CacheConfig:
        """This config as an executor runs it: ``num_blocks`` if given, else ``size_blocks()``
        (what device memory holds); ``memory_model`` if given, else the one passed (the
        executor's for its policy); ``max_model_len`` if given, else the model's (``model`` is
        its name and length limit, which a given length may not exceed); and the CPU blocks of
        ``block_bytes`` that ``swap_space_gib`` holds when preemption swaps (0 otherwise)."""
        model_name, model_max_len = model
        if self.max_model_len is not None and self.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds {model_name}'s context of "
                f"{model_max_len} tokens (--max-model-len, or a --model with a longer one)"
            )
        num_blocks = self.num_blocks or size_blocks()  # after the checks: sizing may profile
        num_cpu_blocks = 0
        if scheduler.preemption_mode == "swap":
            num_cpu_blocks = int(self.swap_space_gib * GIB // block_bytes)
            if num_cpu_blocks == 0:
                raise ValueError(
                    f"preemption_mode 'swap': swap_space_gib {self.swap_space_gib!r} holds no KV "
                    f"block of {block_bytes} bytes (--swap-space-gib larger, or "
                    "--preemption-mode recompute)"
                )
        return replace(
            self,
            num_blocks=num_blocks,
            memory_model=self.memory_model or memory_model,
            max_model_len=self.max_model_len or model_max_len,
            num_cpu_blocks=num_cpu_blocks,
        )

    def check_resolved(self) -> None:
        """Refuse a config whose executor has not called `resolve`."""
        names = ("num_blocks", "memory_model", "max_model_len")
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"CacheConfig: {', '.join(missing)} not set; an executor sets them with "
                "CacheConfig.resolve before it builds a Scheduler"
            )

    @property
    def resolved_num_blocks(self) -> int:
        """``num_blocks`` of a resolved config (ValueError if it is not)."""
        if self.num_blocks is None:
            self.check_resolved()
        assert self.num_blocks is not None
        return self.num_blocks

    @property
    def resolved_max_model_len(self) -> int:
        """``max_model_len`` of a resolved config (ValueError if it is not)."""
        if self.max_model_len is None:
            self.check_resolved()
        assert self.max_model_len is not None
        return self.max_model_len

    @property
    def resolved_memory_model(self) -> MemoryModel:
        """``memory_model`` of a resolved config (ValueError if it is not)."""
        if self.memory_model is None:
            self.check_resolved()
        assert self.memory_model is not None
        return self.memory_model

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: paged memory keeps one back as vLLM's null block."""
        return (
            self.resolved_num_blocks - 1
            if self.memory_model == "paged"
            else self.resolved_num_blocks
        )

    @property
    def num_slots(self) -> int:
        """Token slots requests can use."""
        return self.num_usable_blocks * self.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.resolved_num_blocks)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Budgets and knobs of the scheduler and its policy.

    ``policy`` names one of `core.policies.POLICIES` (checked by `core.policies.check_policy`,
    which the executors' configs and the `Scheduler` call: this module cannot import the
    policies, which import it). ``max_num_batched_tokens`` is the per-step token budget (the
    chunk budget for ``chunked``); ``max_num_seqs`` caps the requests in one step.
    ``batch_size`` and ``max_wait_s`` are the static/dynamic batching parameters.
    ``parallel_sampling`` says how n > 1 runs (PARALLEL_SAMPLING; vLLM v1's fan-out by default).
    ``scheduling_policy`` orders the queues as vLLM's ``--scheduling-policy`` does: ``fcfs`` by
    arrival; ``priority`` by each request's priority (lower first), then arrival, and preempts
    the running request of the lowest priority, latest arrival first.
    """

    policy: str = "chunked"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    preemption_mode: PreemptionMode = "recompute"
    batch_size: int = 8
    max_wait_s: float = 1.0
    parallel_sampling: ParallelSampling = "fan_out"
    scheduling_policy: SchedulingPolicy = "fcfs"

    def __post_init__(self) -> None:
        check_settings(self)


def check_serving(cache: CacheConfig, scheduler: SchedulerConfig) -> None:
    """What the two configs must agree on; every executor's config calls this."""
    if scheduler.preemption_mode == "swap" and cache.swap_space_gib == 0:
        raise ValueError(
            "preemption_mode 'swap' needs CPU swap space, but swap_space_gib is 0 "
            "(--swap-space-gib > 0, or --preemption-mode recompute)"
        )


# -- the settings table ------------------------------------------------------------------------

Check = Callable[[Any], str | None]
"""The problem with a value (``must be >= 1, got 0``), or None if it is fine."""


def at_least(low: int) -> Check:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be >= {low}, got {value!r}"

    return check


def optional(check: Check) -> Check:
    """``check``, with None (left to the executor) allowed."""

    def check_optional(value: Any) -> str | None:
        return None if value is None else check(value)

    return check_optional


def power_of_two(value: Any) -> str | None:
    if value >= 1 and not value & (value - 1):
        return None
    return f"must be a power of two, got {value!r}"


def share(value: Any) -> str | None:
    """In (0, 1]; NaN fails both comparisons."""
    return None if 0 < value <= 1 else f"must be in (0, 1], got {value!r}"


def finite_non_negative(value: Any) -> str | None:
    return None if 0 <= value < math.inf else f"must be a finite number >= 0, got {value!r}"


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the settings table: a config field, how its flag's text is read (``int``,
    ``float``, ``str``, or ``bool`` for a switch), the help a newcomer reads, the check its
    value must pass, the fixed choices (None: any, or given where the flags are built), what
    None means where it is the default, and the flag's spellings from before it was named
    after the field."""

    field: str
    type: Callable[[str], Any]
    help: str
    check: Check | None = None
    choices: tuple[str, ...] | None = None
    none_means: str | None = None
    old_flags: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        if self.choices is not None and value is not None and value not in self.choices:
            return f"must be one of {self.choices}, got {value!r}"
        return None if self.check is None else self.check(value)


SETTINGS: tuple[Setting, ...] = (
    # CacheConfig
    Setting("block_size", int, "KV cache block size in tokens (a power of two)", power_of_two),
    Setting(
        "num_blocks",
        int,
        "KV cache blocks per replica, counted as vLLM's num_gpu_blocks: paged memory keeps one "
        "of them back as its null block",
        optional(at_least(1)),
        none_means="sized from device memory, as vLLM does",
    ),
    Setting(
        "gpu_memory_utilization",
        float,
        "share of GPU memory for the weights, activations and KV cache together",
        share,
    ),
    Setting(
        "swap_space_gib",
        float,
        "CPU memory in GiB per replica that --preemption-mode swap moves KV blocks to",
        finite_non_negative,
    ),
    Setting(
        "memory_model",
        str,
        "how KV memory is handed out: paged (fixed-size blocks, vLLM's PagedAttention) or "
        "contiguous (one range per sequence, reserved up front, as before paging)",
        choices=MEMORY_MODELS,
        none_means="the policy's own: contiguous for static and dynamic, paged otherwise",
        old_flags=("--memory",),
    ),
    Setting(
        "reservation",
        str,
        "contiguous memory only: how many slots a sequence reserves: max (max_model_len), "
        "pow2 (its length rounded up to a power of two) or oracle (exactly its length)",
        choices=RESERVATION_RULES,
    ),
    Setting(
        "enable_prefix_caching",
        bool,
        "reuse the KV blocks of a prompt prefix that an earlier request computed (paged memory)",
        old_flags=("--prefix-caching",),
    ),
    Setting(
        "max_model_len",
        int,
        "most tokens (prompt + output) one request may hold; longer requests are rejected",
        optional(at_least(1)),
        none_means="the model's context length",
    ),
    # SchedulerConfig
    Setting(
        "policy",
        str,
        "batching policy: static (fixed batches run to the end), dynamic (static, but a batch "
        "starts after --max-wait-s), continuous (requests join and leave between steps) or "
        "chunked (continuous, prompts split into chunks that share steps with decodes)",
    ),
    Setting("max_num_seqs", int, "most sequences in one step", at_least(1)),
    Setting(
        "max_num_batched_tokens",
        int,
        "most tokens one step computes (the chunk budget of chunked prefill)",
        at_least(1),
        old_flags=("--max-batch-tokens",),
    ),
    Setting(
        "preemption_mode",
        str,
        "when memory runs out, a running request is preempted: recompute drops its KV cache "
        "and computes it again later; swap copies its blocks to CPU memory and back",
        choices=PREEMPTION_MODES,
        old_flags=("--preemption",),
    ),
    Setting("batch_size", int, "static and dynamic batching: requests per batch", at_least(1)),
    Setting(
        "max_wait_s",
        float,
        "dynamic batching: start a batch once its oldest request has waited this many seconds",
        finite_non_negative,
    ),
    Setting(
        "parallel_sampling",
        str,
        "how a request with n > 1 samples runs: fan_out (vLLM v1: n child requests scheduled "
        "each on its own, sharing only through the prefix cache) or fork (the vLLM paper and "
        "v0: the prompt computed once, its blocks shared copy-on-write by n sequences)",
        choices=PARALLEL_SAMPLING,
    ),
    Setting(
        "scheduling_policy",
        str,
        "the order requests are served in, as vLLM's --scheduling-policy: fcfs (by arrival) or "
        "priority (by each request's priority, lower first, then arrival; memory runs out: "
        "the running request of the lowest priority is preempted, even one already in the step)",
        choices=SCHEDULING_POLICIES,
    ),
)
SETTINGS_BY_FIELD: dict[str, Setting] = {row.field: row for row in SETTINGS}
SETTING_NAMES: tuple[str, ...] = tuple(SETTINGS_BY_FIELD)
"""Every setting of `CacheConfig` and `SchedulerConfig`, in the table's order."""


def setting_fields(config_class: type) -> list[str]:
    """The fields of a config class that are settings (all but those marked NOT_A_SETTING)."""
    return [f.name for f in fields(config_class) if f.metadata.get("setting", True)]


def check_settings(config: object) -> None:
    """Each setting of ``config`` against its row's check (raises `ConfigError`)."""
    for name in setting_fields(type(config)):
        problem = SETTINGS_BY_FIELD[name].problem(getattr(config, name))
        if problem is not None:
            raise ConfigError(name, problem)
