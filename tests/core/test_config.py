"""The serving configuration: the settings table and the config classes agree field by field,
each check lives in the table and gives the same words to a config and to its flag, the flags
are generated once each with the config's default and their old spellings, the fields an
executor sizes are resolved once and a Scheduler refuses a config that is not, and a config
tree reads and writes as flat settings."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

import pytest

from core.config import (
    NOT_A_SETTING,
    SETTINGS,
    CacheConfig,
    SchedulerConfig,
    check_serving,
    setting_fields,
)
from core.errors import ConfigError
from core.flags import add_setting_flags, given_settings
from core.policies import POLICIES, check_budgets, check_policy
from core.scheduler import Scheduler
from core.settings import build, flat_settings, setting_names, with_settings

CORE = (CacheConfig, SchedulerConfig)
NAMES = setting_names(CacheConfig) + setting_names(SchedulerConfig)
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class _Holder:
    """An executor's config in miniature: the core's two and fields of its own."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: str = "m"
    seed: int = 0


def _parser(**options: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_setting_flags(parser, CORE, **options)  # type: ignore[arg-type]
    return parser


def _config(argv: list[str]) -> _Holder:
    return build(_Holder, given_settings(_parser().parse_args(argv), NAMES))


def test_the_table_has_one_row_per_setting_and_no_other() -> None:
    rows = [row.field for row in SETTINGS]
    assert len(rows) == len(set(rows))
    assert sorted(rows) == sorted(NAMES)
    not_settings = {f.name for c in CORE for f in fields(c) if f.metadata == NOT_A_SETTING}
    assert not_settings == {"num_cpu_blocks", "watermark"}
    assert not set(rows) & not_settings


def test_each_flag_is_generated_once_with_the_configs_default() -> None:
    parser = _parser()
    actions = [a for a in parser._actions if a.dest in NAMES]
    assert sorted(a.dest for a in actions) == sorted(NAMES)  # one action per setting
    strings = [s for a in parser._actions for s in a.option_strings]
    assert len(strings) == len(set(strings))
    defaults = {**flat_settings(_Holder())}
    for action in actions:
        assert action.option_strings[0] == "--" + action.dest.replace("_", "-")
        assert action.default is None  # "not given": the config's default applies
        default = defaults[action.dest]
        if isinstance(default, bool):
            assert action.help is not None and action.help.endswith("(default: off)")
        elif default is not None:
            assert action.help is not None and action.help.endswith(f"(default: {default})")
    assert _config([]) == _Holder()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["--max-batch-tokens", "512"], ["--max-num-batched-tokens", "512"]),
        (["--prefix-caching"], ["--enable-prefix-caching"]),
        (["--preemption", "swap"], ["--preemption-mode", "swap"]),
        (["--memory", "contiguous"], ["--memory-model", "contiguous"]),
    ],
)
def test_an_old_spelling_gives_the_same_config(old: list[str], new: list[str]) -> None:
    assert _config(old) == _config(new) != _Holder()


@pytest.mark.parametrize(
    ("flag", "text", "setting", "value"),
    [
        ("--max-num-batched-tokens", "0", "max_num_batched_tokens", 0),
        ("--block-size", "12", "block_size", 12),
        ("--gpu-memory-utilization", "1.5", "gpu_memory_utilization", 1.5),
        ("--swap-space-gib", "inf", "swap_space_gib", float("inf")),
        ("--max-wait-s", "-1", "max_wait_s", -1.0),
        ("--num-blocks", "0", "num_blocks", 0),
    ],
)
def test_a_bad_value_is_refused_in_the_same_words_by_flag_and_config(
    flag: str, text: str, setting: str, value: object
) -> None:
    with pytest.raises(argparse.ArgumentError) as by_flag:
        _parser().parse_args([flag, text])
    with pytest.raises(ConfigError) as by_config:
        build(_Holder, {setting: value})
    assert by_config.value.field == setting
    assert str(by_config.value) == f"{setting} {by_config.value.problem}"
    message = str(by_flag.value)
    assert message.startswith(f"argument {flag}") and message.endswith(by_config.value.problem)


def test_choices_skip_and_only() -> None:
    parser = _parser(skip=("memory_model", "reservation"), choices={"policy": ("a", "b")})
    dests = {a.dest for a in parser._actions}
    assert "memory_model" not in dests and "reservation" not in dests
    policy = next(a for a in parser._actions if a.dest == "policy")
    assert policy.choices == ("a", "b")
    assert tuple(next(a for a in _parser()._actions if a.dest == "policy").choices) == tuple(
        POLICIES
    )
    only = argparse.ArgumentParser()
    assert add_setting_flags(only, (CacheConfig,), only=("block_size",)) == ["block_size"]
    with pytest.raises(ValueError, match="no such setting"):
        add_setting_flags(argparse.ArgumentParser(), CORE, skip=("max_batch_tokens",))


def test_policies_are_checked_against_the_one_list() -> None:
    for name in POLICIES:
        check_policy(name)
    check_policy("disagg", also=("disagg",))
    with pytest.raises(ConfigError, match="pool_policy must be one of"):
        check_policy("disagg", field="pool_policy")
    with pytest.raises(ValueError, match="policy must be one of"):
        Scheduler(_resolved(), SchedulerConfig(policy="fifo"))


def test_swap_needs_swap_space_in_one_place() -> None:
    with pytest.raises(ValueError, match="swap_space_gib is 0"):
        check_serving(CacheConfig(swap_space_gib=0.0), SchedulerConfig(preemption_mode="swap"))
    check_serving(CacheConfig(swap_space_gib=0.0), SchedulerConfig())


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_a_token_budget_below_max_num_seqs_is_refused_where_a_policy_spends_it(
    policy: str,
) -> None:
    # vLLM refuses to start on max_num_batched_tokens < max_num_seqs; so does every executor.
    with pytest.raises(ConfigError, match=r"must be >= max_num_seqs \(256\) under policy") as err:
        check_budgets(SchedulerConfig(policy=policy, max_num_batched_tokens=64))
    assert err.value.field == "max_num_batched_tokens"
    check_budgets(SchedulerConfig(policy=policy, max_num_seqs=64, max_num_batched_tokens=64))
    # The policy the replicas run decides, where it is not the config's own (disagg's pools).
    with pytest.raises(
        ConfigError, match=f"under policy '{policy}' .the pools of 'static'., got 8"
    ):
        check_budgets(SchedulerConfig(policy="static", max_num_batched_tokens=8), policy)


def test_static_batching_spends_no_token_budget_so_any_budget_goes() -> None:
    for policy in ("static", "dynamic"):
        check_budgets(SchedulerConfig(policy=policy, max_num_batched_tokens=8))


def _resolved(**settings: object) -> CacheConfig:
    cache: CacheConfig = build(CacheConfig, settings)
    return cache.resolve(
        SchedulerConfig(),
        size_blocks=lambda: 100,
        block_bytes=GIB // 8,
        memory_model="paged",
        model=("m", 2048),
    )


def test_resolve_fills_what_the_executor_sizes_once() -> None:
    cache = _resolved()
    assert (cache.num_blocks, cache.memory_model, cache.max_model_len) == (100, "paged", 2048)
    assert cache.num_cpu_blocks == 0  # recompute: no host blocks
    given = _resolved(num_blocks=7, memory_model="contiguous", max_model_len=512)
    assert (given.num_blocks, given.memory_model, given.max_model_len) == (7, "contiguous", 512)
    swap = CacheConfig(swap_space_gib=1.0).resolve(
        SchedulerConfig(preemption_mode="swap"),
        size_blocks=lambda: 100,
        block_bytes=GIB // 8,
        memory_model="paged",
        model=("m", 2048),
    )
    assert swap.num_cpu_blocks == 8


def test_resolve_refuses_what_cannot_apply() -> None:
    with pytest.raises(ValueError, match="exceeds m's context of 2048 tokens"):
        _resolved(max_model_len=4096)
    with pytest.raises(ValueError, match="holds no KV block"):
        CacheConfig(swap_space_gib=0.1).resolve(
            SchedulerConfig(preemption_mode="swap"),
            size_blocks=lambda: 100,
            block_bytes=GIB,
            memory_model="paged",
            model=("m", 2048),
        )
    with pytest.raises(ValueError, match="prefix_caching"):
        _resolved(enable_prefix_caching=True, memory_model="contiguous")


def test_a_scheduler_refuses_a_config_that_is_not_resolved() -> None:
    with pytest.raises(ValueError, match="num_blocks, memory_model, max_model_len not set"):
        Scheduler(CacheConfig(), SchedulerConfig())
    Scheduler(_resolved(), SchedulerConfig())


def test_a_tree_reads_and_writes_as_flat_settings() -> None:
    names = setting_names(_Holder)
    assert len(names) == len(set(names))
    holder = build(_Holder, block_size=32, policy="static", seed=3)
    assert holder.cache.block_size == 32 and holder.scheduler.policy == "static"
    flat = flat_settings(holder)
    assert list(flat) == names and "num_cpu_blocks" not in flat and "watermark" not in flat
    assert build(_Holder, flat) == holder
    changed = with_settings(holder, max_num_seqs=4, model="x")
    assert (changed.scheduler.max_num_seqs, changed.model, changed.cache) == (4, "x", holder.cache)
    with pytest.raises(ValueError, match="unknown setting 'max_batch_tokens'"):
        build(_Holder, max_batch_tokens=8)


def test_settings_are_the_fields_not_marked_otherwise() -> None:
    assert setting_fields(CacheConfig) == [
        f.name for f in fields(CacheConfig) if f.name not in ("num_cpu_blocks", "watermark")
    ]
