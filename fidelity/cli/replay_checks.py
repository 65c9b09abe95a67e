"""What ``python -m sim validate --replay RUN [--replay RERUN]`` checks before it replays: the
flags beside a recorded run, and that a second run is a rerun of the first."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from core.config import SETTINGS_BY_FIELD, CacheConfig, SchedulerConfig
from core.flags import given_settings
from core.settings import flat_settings

# What two runs of one configuration share, besides every KV cache and scheduler setting: the
# top-level keys of summary.json and the keys of its ``config``. (A GPU engine sizes its KV
# cache from the memory free when it starts, so two runs of one configuration may differ in
# ``num_blocks``: that is said, not refused.)
_SAME_RUN_KEYS = ("trace",)
_SAME_CONFIG_KEYS = ("model", "device", "dtype", "enforce_eager", "mixed_graphs", "time_scale")


def check_replay_options(run_dir: str, summary: dict[str, Any], args: argparse.Namespace) -> None:
    """With ``--replay``, the simulator replays the run's own KV cache and scheduler settings
    (`fidelity.validate.sim_config`), so a setting given on the command line that the run did
    not run with is refused, not dropped; and without ``--profile``, calibrating on another
    kind of device than the run's would price another machine, so that is refused too."""
    recorded = summary.get("config") or {}
    where = Path(run_dir) / "summary.json"
    defaults = {**flat_settings(CacheConfig()), **flat_settings(SchedulerConfig())}
    differ = []
    for name, value in given_settings(args).items():
        ran = summary.get("num_blocks") if name == "num_blocks" else recorded.get(name)
        ran = defaults.get(name) if ran is None and name != "num_blocks" else ran
        if value != ran:
            differ.append(f"{SETTINGS_BY_FIELD[name].flag} {value} (the run: {ran})")
    if differ:
        raise ValueError(
            f"--replay {run_dir}: the simulator replays the run's own settings ({where}), "
            f"so these cannot apply: {', '.join(differ)}; leave them out, or validate "
            "against a run made with them"
        )
    ran_on = str(recorded.get("device", "cpu"))
    if args.profile is None and ran_on.split(":")[0] != args.device.split(":")[0]:
        raise ValueError(
            f"--replay {run_dir}: the run was made on {ran_on} ({where}), and without "
            f"--profile validate would calibrate a profile on --device {args.device} here, "
            "which prices another machine's engine; give --profile (a calibration of the "
            "run's machine) or --device to match the run on such a machine"
        )


def check_rerun(
    run_dir: str, summary: dict[str, Any], rerun_dir: str, rerun: dict[str, Any]
) -> str | None:
    """The second ``--replay`` is the engine against itself (the noise floor) only if it ran
    what the first ran: the same trace, KV cache settings, scheduler, model and device.
    Otherwise its differences are the configurations', and are refused, naming each. Returns
    a note when only the KV cache's size differs (None when nothing does)."""
    config, other = summary.get("config") or {}, rerun.get("config") or {}
    settings = {*flat_settings(CacheConfig()), *flat_settings(SchedulerConfig())}
    differ = [
        f"{name} {other.get(name)!r} (the first: {config.get(name)!r})"
        for name in sorted(settings) + list(_SAME_CONFIG_KEYS)
        if config.get(name) != other.get(name)
    ]
    differ += [
        f"{name} {rerun.get(name)!r} (the first: {summary.get(name)!r})"
        for name in _SAME_RUN_KEYS
        if summary.get(name) != rerun.get(name)
    ]
    if differ:
        raise ValueError(
            f"--replay {rerun_dir}: not a rerun of {run_dir}, so not the engine against "
            f"itself: {', '.join(differ)}; give two runs of one configuration"
        )
    blocks, other_blocks = summary.get("num_blocks"), rerun.get("num_blocks")
    if blocks == other_blocks:
        return None
    return (
        f"--replay {rerun_dir}: its KV cache holds {other_blocks} blocks, {run_dir}'s "
        f"{blocks} (sized from the memory free at start); the floor includes that difference"
    )
