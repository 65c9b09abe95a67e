"""``python -m sim compare TRACE --policies ...``: simulate one trace once per policy / memory
model item, one sub-folder per run under --out and one report comparing them."""

from __future__ import annotations

import argparse
from typing import Any

from core.config import MEMORY_MODELS, RESERVATION_RULES
from core.settings import build
from sim.cli.options import add_run_arguments, run_settings, with_vllm_defaults
from sim.cli.run import (
    check_output_paths,
    command_line,
    print_skipped,
    print_summary,
    write_outputs,
)
from sim.run import POLICY_CHOICES, RunConfig, simulate
from traces.loaders import load_trace


def add_compare_command(commands: Any) -> None:
    """Register ``compare`` on `commands` (what `add_subparsers` returned)."""
    compare: argparse.ArgumentParser = commands.add_parser(
        "compare",
        help="simulate several policies / memory models on one trace",
        description="Run TRACE once per --policies item (policy[:memory[:reservation]]), "
        "writing one sub-folder per run under --out and one report comparing them.",
    )
    add_run_arguments(compare)
    compare.add_argument(
        "--policies",
        required=True,
        help="comma-separated policy[:memory[:reservation]] items, e.g. "
        "'static,continuous,chunked' or 'continuous:contiguous:max,continuous:paged'",
    )
    # compare takes --policies; --policy (shared with run) is refused there, not ignored.
    compare.set_defaults(func=compare_command)


def parse_variants(text: str) -> list[tuple[str, str | None, str | None]]:
    """``policy[:memory[:reservation]]`` items, comma-separated."""
    variants: list[tuple[str, str | None, str | None]] = []
    for item in text.split(","):
        parts: list[str | None] = list(item.strip().split(":"))
        if not parts[0] or len(parts) > 3:
            raise ValueError(f"--policies item {item!r}: expected policy[:memory[:reservation]]")
        policy, memory, reservation = [*parts, None, None][:3]
        if policy is None or policy not in POLICY_CHOICES:
            raise ValueError(f"--policies item {item!r}: unknown policy {policy!r}")
        if memory is not None and memory not in MEMORY_MODELS:
            raise ValueError(f"--policies item {item!r}: memory must be one of {MEMORY_MODELS}")
        if reservation is not None and reservation not in RESERVATION_RULES:
            raise ValueError(
                f"--policies item {item!r}: reservation must be one of {RESERVATION_RULES}"
            )
        if (policy, memory, reservation) in variants:
            raise ValueError(f"--policies: item {item.strip()!r} appears twice")
        variants.append((policy, memory, reservation))
    return variants


def _compare_configs(args: argparse.Namespace) -> list[tuple[str, RunConfig]]:
    """(folder name, config) per --policies item, checked before anything runs."""
    if args.policy is not None:
        raise ValueError("--policy: compare runs one policy per --policies item; use --policies")
    # Each item's config is built whole from the options and its policy, so that checks that
    # depend on the policy (core.policies.check_budgets) judge that policy, not the default.
    settings = run_settings(args)
    named = []
    for policy, memory, reservation in parse_variants(args.policies):
        if reservation and memory == "paged":
            raise ValueError(
                f"--policies {policy}:{memory}:{reservation}: a reservation rule "
                "applies to contiguous memory only"
            )
        item = {"policy": policy, "memory_model": memory, "reservation": reservation}
        chosen = {**settings, **{k: v for k, v in item.items() if v is not None}}
        config = build(RunConfig, with_vllm_defaults(chosen, args))
        named.append(("_".join(p for p in (policy, memory, reservation) if p), config))
    if args.reservation and all(c.resolved_memory_model() == "paged" for _, c in named):
        raise ValueError(
            f"--reservation {args.reservation}: applies to contiguous memory only, and every "
            "--policies item runs paged memory"
        )
    return named


def compare_command(args: argparse.Namespace) -> int:
    named = _compare_configs(args)
    trace = load_trace(args.trace, format=args.format, on_error=args.on_error)
    print_skipped(trace)
    check_output_paths(args)
    results = []
    for _, config in named:
        result = simulate(trace, config, progress=not args.quiet)
        result.command = command_line(args)
        if not args.quiet:
            print_summary(result)
            print()
        results.append(result)
    write_outputs(args, results, [name for name, _ in named])
    return 0
