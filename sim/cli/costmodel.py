"""The `costmodel` and `profile` sub-commands of `python -m sim`, kept apart from the run
options in run_options.py: `costmodel check` holds the roofline to measured op times."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from core.model.presets import load_model_spec
from sim.costmodel.check import add_check_arguments, check_command
from sim.costmodel.llmservingsim_import import llmservingsim_profile, write_profile
from sim.costmodel.profile_import import vidur_profile, write_vidur_profile


def add_costmodel_commands(commands: Any) -> None:
    """Register the sub-commands on `commands` (what `add_subparsers` returned)."""
    costmodel = commands.add_parser("costmodel", help="hold the cost model to measured times")
    costmodel_commands = costmodel.add_subparsers(dest="costmodel_command", required=True)
    check: argparse.ArgumentParser = costmodel_commands.add_parser(
        "check",
        help="compare the roofline with Vidur's measured op times",
        description="For every measured shape in a Vidur profile directory that fits MODEL, "
        "print our prediction against the measured median per op (linear layers, elementwise "
        "ops, all-reduce, attention) and for whole decode and prefill steps built as the sum "
        "of measured ops: median and max absolute %% error and the signed bias.",
    )
    add_check_arguments(check)
    check.set_defaults(func=check_command)
    profile = commands.add_parser("profile", help="make cost-model profiles")
    profile_commands = profile.add_subparsers(dest="profile_command", required=True)
    importer: argparse.ArgumentParser = profile_commands.add_parser(
        "import-vidur",
        help="convert Vidur's measured CSVs into a --profile file",
        description="Write the linear, elementwise, attention and all-reduce tables that a "
        "Vidur profile directory holds for MODEL at TP into our profile format "
        "(docs/profile_format.md); ops it does not time fall back to the roofline.",
    )
    importer.add_argument("--vidur-dir", required=True, help="a Vidur profile directory")
    importer.add_argument("--model", required=True, help="model preset or config.json path")
    importer.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    importer.add_argument("--out", required=True, help="profile JSON to write")
    importer.add_argument("--gpu", default=None, help="folder under compute/ (default: the only)")
    importer.add_argument("--node", default=None, help="network node type (default: dgx)")
    importer.set_defaults(func=import_vidur_command)
    bundle: argparse.ArgumentParser = profile_commands.add_parser(
        "import-llmservingsim",
        help="convert an LLMServingSim per-layer profile bundle into a --profile file",
        description="Write the linear, elementwise, LM-head and sampler tables, the 4-D "
        "attention table and the skew fit that an LLMServingSim profile bundle (DIR: the folder "
        "holding meta.yaml and tp<N>/, e.g. profiler/perf/<GPU>/<org>/<model>/bf16) holds at TP "
        "into our profile format, version 5 (docs/profile_format.md). Past the measured sizes the "
        "tables follow the roofline's shape; the all-reduce, copies and swaps come from the "
        "roofline on the run's hardware.",
    )
    bundle.add_argument("bundle", metavar="DIR", help="an LLMServingSim profile bundle folder")
    bundle.add_argument("--tp", type=int, required=True, help="tensor-parallel degree (tp<N>/)")
    bundle.add_argument("--out", required=True, help="profile JSON to write")
    bundle.add_argument(
        "--model", default=None, help="model preset or config.json (default: meta.yaml's model)"
    )
    bundle.set_defaults(func=import_llmservingsim_command)


def import_vidur_command(args: argparse.Namespace) -> int:
    model = load_model_spec(args.model)
    words = ["--vidur-dir", args.vidur_dir, "--model", args.model, "--tp", str(args.tp)]
    words += ["--out", args.out]
    for flag, value in (("--gpu", args.gpu), ("--node", args.node)):
        if value is not None:
            words += [flag, value]
    command = "python -m sim profile import-vidur " + shlex.join(words)
    if args.node is not None and args.tp == 1:
        note = "note: --node: one GPU (--tp 1) runs no all-reduce; it has no effect"
        print(note, file=sys.stderr)
    profile = vidur_profile(args.vidur_dir, model, args.tp, command, args.gpu, args.node)
    write_vidur_profile(profile, args.out)
    print(f"wrote {args.out}: {', '.join(profile['ops'])} (the rest from the roofline)")
    return 0


def import_llmservingsim_command(args: argparse.Namespace) -> int:
    model = load_model_spec(args.model) if args.model else None
    words = [args.bundle, "--tp", str(args.tp), "--out", args.out]
    if args.model:
        words += ["--model", args.model]
    command = "python -m sim profile import-llmservingsim " + shlex.join(words)
    profile = llmservingsim_profile(args.bundle, args.tp, command, model)
    write_profile(profile, args.out)
    points = len(profile["ops"]["attention"]["time_s"])
    skew = "with its skew fit" if "decode_skew" in profile else "without a skew fit"
    moe = ", the MoE layer" if "experts" in profile["ops"] else ""
    print(
        f"wrote {args.out}: {profile['model']} at tp={args.tp}, linear, elementwise, lm_head"
        f"{moe} and {points} attention points, {skew}"
    )
    return 0
