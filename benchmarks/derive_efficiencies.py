"""The kernel efficiencies of each GPU with op-level tables, derived from them
(``sim.costmodel.efficiency_fit``; docs/hardware_efficiency.md), beside what its preset states:

- A100-80GB: Vidur's A100 tables in ../shared/profiles/vidur (mlp.csv of four models at TP 1-8,
  the Llama-2-70B TP 2 attention.csv), on which the defaults were fitted;
- RTX-PRO-6000-Server: LLMServingSim's RTX PRO 6000 bundles in ../shared/profiles/llmservingsim
  (Llama-3.1-8B and Qwen3-32B, TP 1 and 2);
- RTX-4090: LLMServingSim's RTX 4090 bundle (Llama-3.1-8B, TP 1), read from
  ``--llmservingsim-repo`` (a checkout or the git directory of github.com/casys-kaist/
  LLMServingSim) into a scratch folder when given;
- H200: the linear tables of our own four calibrations of Llama-3-8B on an H200
  (``--servesim-profiles``, by default those of benchmarks/results/gpu-h200-2026-11-27/call2:
  the engine with CUDA graphs and the eager engine, twice each). Only the GEMM efficiencies:
  the attention tables time servesim's Triton kernels, not vLLM's. From their decode,
  elementwise and LM head tables, servesim's own kernels (``sim.costmodel.own_kernel_fit``,
  priced for servesim's engines only): the decode kernel's fixed cost, the fused row kernels'
  fixed cost and bandwidth, the LM head's fixed cost, pooled and per table.

Each fit starts from HardwareSpec's defaults, so what it derives does not depend on what the
preset says today; the preset's values are printed beside, and a mismatch is flagged for the
presets that state derived values (the A100 keeps the defaults, fitted on the same tables
earlier: the differences are shown).

Run from the repository root:
PYTHONPATH=. python benchmarks/derive_efficiencies.py [--llmservingsim-repo PATH] [--gpu NAME]
(results committed in benchmarks/results/efficiencies.txt)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
from pathlib import Path

from llmservingsim_repo import copy_bundles

from core.model.presets import load_model_spec
from sim.costmodel.efficiency_fit import (
    FIELDS,
    EfficiencyFit,
    OpTable,
    bundle_tables,
    fit_efficiencies,
    servesim_table,
    vidur_tables,
)
from sim.costmodel.own_kernel_fit import (
    KernelTable,
    fit_decode_latency,
    fit_fused_rows,
    fit_lm_head_latency,
    servesim_decode_table,
    servesim_kernel_table,
)
from sim.specs.hardware import HardwareSpec, get_hardware_preset

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "profiles"
H200_CHECK = Path(__file__).resolve().parent / "results" / "gpu-h200-2026-11-27" / "call2"
H200_PROFILES = tuple(
    H200_CHECK / calibration / name
    for calibration in ("calibrate", "calibrate-eager")
    for name in ("profile.json", "profile-repeat2.json")
)
VIDUR_MODELS = ("Llama-2-7B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B")
DIGITS = 2  # as the presets state them


def _defaults(preset: HardwareSpec) -> HardwareSpec:
    """``preset`` with every fitted field at HardwareSpec's default."""
    defaults = {f.name: f.default for f in dataclasses.fields(HardwareSpec) if f.name in FIELDS}
    return dataclasses.replace(preset, **defaults)


def _unique(tables: list[OpTable]) -> list[OpTable]:
    """One table per source file and TP degree (two Vidur models can share an attention.csv)."""
    seen: dict[str, OpTable] = {}
    for table in tables:
        seen.setdefault(table.source, table)
    return list(seen.values())


def _bundles(root: Path, gpu: str) -> list[OpTable]:
    return [
        t
        for meta in sorted((root / gpu).glob("*/*/bf16/meta.yaml"))
        for t in bundle_tables(meta.parent)
    ]


def _own_fits(
    old: HardwareSpec, decode: OpTable, rows: KernelTable, lm_head: KernelTable
) -> list[EfficiencyFit]:
    return [
        fit_decode_latency([decode], old),
        *fit_fused_rows([rows], old),
        fit_lm_head_latency([lm_head], old),
    ]


def _report_own_kernels(name: str, profiles: list[Path], out: dict | None = None) -> None:
    """Fit servesim's own kernels (``sim.costmodel.own_kernel_fit``) to ``profiles`` (timed on
    preset ``name``), pooled and one by one, and print each beside the preset's. "Before": the
    roofline as it priced these kernels before they had fields of their own (the decode
    kernel at ``attention_latency_s``, vLLM's row kernels, no LM head fixed cost)."""
    preset = get_hardware_preset(name)
    old = dataclasses.replace(preset, decode_latency_s=preset.attention_latency_s)
    decode = [servesim_decode_table(p) for p in profiles]
    rows = [servesim_kernel_table(p, "elementwise") for p in profiles]
    lm_head = [servesim_kernel_table(p, "lm_head") for p in profiles]
    pooled = [
        fit_decode_latency(decode, old),
        *fit_fused_rows(rows, old),
        fit_lm_head_latency(lm_head, old),
    ]
    if out is not None:
        for fit in pooled:
            out.setdefault(name, {})[fit.field] = {
                **dataclasses.asdict(fit),
                "preset": getattr(preset, fit.field),
            }
    print(f"\n  servesim's own kernels (decode: per layer, before at attention_latency_s "
          f"{1e6 * preset.attention_latency_s:g} us; rows: per layer, before as vLLM's row "
          "kernels; LM head: per step, before without it)")  # fmt: skip
    print(f"  {'field':<31} {'table':<46} {'fit':>7} {'stated':>7} {'preset':>7} {'points':>7} "
          f"{'err before':>11} {'after':>7}")  # fmt: skip
    by_table = [
        (_short(p), _own_fits(old, *tables))
        for p, *tables in zip(profiles, decode, rows, lm_head, strict=True)
    ]
    for i, fit in enumerate(pooled):
        scale, digits = (1.0, DIGITS) if fit.field.endswith("efficiency") else (1e6, 1)
        stated = round(fit.value * scale, digits)
        have = getattr(preset, fit.field) * scale
        flag = "" if round(have, digits) == stated else "   <- the preset differs"
        unit = "" if scale == 1.0 else " us"
        for label, each in [("pooled", fit)] + [(lab, fits[i]) for lab, fits in by_table]:
            cells = " " * 15
            if label == "pooled":
                cells = f"{stated:7.{digits if scale == 1.0 else 1}f} {have:7.{DIGITS}f}"
            print(
                f"  {fit.field + unit:<31} {label:<46} {each.value * scale:7.3f} {cells} "
                f"{each.num_points:7d} {each.before_pct:+10.1f}% {each.after_pct:+6.1f}%"
                + (flag if label == "pooled" else "")
            )


def _short(path: Path) -> str:
    return str(path.relative_to(H200_CHECK)) if path.is_relative_to(H200_CHECK) else str(path)


def _report(
    name: str, where: str, tables: list[OpTable], derived: bool = True, out: dict | None = None
) -> None:
    """Fit ``tables`` and print each field beside preset ``name``'s; ``derived``: the preset
    states these fits (a mismatch is flagged), else it keeps the defaults (differences shown).
    ``out``: also store the fits there, under ``name``, as data."""
    preset = get_hardware_preset(name)
    fits = fit_efficiencies(tables, _defaults(preset), DIGITS)
    if out is not None:
        out[name] = {
            field: {**dataclasses.asdict(fit), "preset": getattr(preset, field)}
            for field, fit in fits.items()
        }
    print(f"\n{name} ({where}; {len(tables)} tables)")
    print(f"  {'field':<38} {'fit':>6} {'stated':>7} {'preset':>7} {'points':>7} "
          f"{'err before':>11} {'after':>7}")  # fmt: skip
    for field in FIELDS:
        fit: EfficiencyFit | None = fits.get(field)
        have = getattr(preset, field)
        if fit is None:
            print(f"  {field:<38} {'-':>6} {'-':>7} {have!s:>7}   no point governs it")
            continue
        stated = round(fit.value, DIGITS)
        if derived:
            flag = "" if have == stated else "   <- the preset differs"
        else:
            flag = f"   (default kept: {stated - have:+.2f})" if have is not None else ""
        note = " (clipped at the datasheet peak)" if fit.clipped else ""
        print(
            f"  {field:<38} {fit.value:6.3f} {stated:7.2f} {have!s:>7} {fit.num_points:7d} "
            f"{fit.before_pct:+10.1f}% {fit.after_pct:+6.1f}%{flag}{note}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, default=SHARED / "vidur")
    parser.add_argument("--bundles", type=Path, default=SHARED / "llmservingsim")
    parser.add_argument("--llmservingsim-repo", type=Path, default=None)
    parser.add_argument(
        "--servesim-profiles", type=Path, nargs="+", default=list(H200_PROFILES),
        help="servesim profiles timed on an H200 (the H200's GEMM efficiencies)",
    )  # fmt: skip
    parser.add_argument(
        "--servesim-gpu", default="H200", help="the preset --servesim-profiles were timed on"
    )
    parser.add_argument("--gpu", action="append", help="only these presets (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the fits here, as data")
    args = parser.parse_args()
    wanted = set(args.gpu or ("A100-80GB", "RTX-PRO-6000-Server", "RTX-4090", args.servesim_gpu))
    fits: dict[str, dict] = {}
    print(f"python {platform.python_version()} on {platform.machine()}")
    print("per field: the fitted value, as the preset would state it, what the preset states,")
    print("the points it stands on, and the roofline's median signed error over them (+ =")
    print("slower than measured) at HardwareSpec's default (fields fitted before it applied; for")
    print("the mixed field, None: the decode-only efficiency fitted above) and at the fit")
    if "A100-80GB" not in wanted:
        pass
    elif (args.vidur / "compute" / "a100").is_dir():
        models = [load_model_spec(m) for m in VIDUR_MODELS]
        tables = _unique([t for m in models for t in vidur_tables(args.vidur, m, "a100")])
        where = f"Vidur's a100 tables, {', '.join(VIDUR_MODELS)}: the defaults' source"
        _report("A100-80GB", where, tables, derived=False, out=fits)
    else:
        print(f"\nskipped A100-80GB: {args.vidur} is absent")
    if "RTX-PRO-6000-Server" not in wanted:
        pass
    elif (args.bundles / "RTXPRO6000").is_dir():
        _report(
            "RTX-PRO-6000-Server",
            "LLMServingSim's RTXPRO6000 bundles",
            _bundles(args.bundles, "RTXPRO6000"),
            out=fits,
        )
    else:
        print(f"\nskipped RTX-PRO-6000-Server: {args.bundles} is absent")
    if "RTX-4090" not in wanted:
        pass
    elif args.llmservingsim_repo is not None:
        with tempfile.TemporaryDirectory() as scratch:
            root = copy_bundles(args.llmservingsim_repo, Path(scratch))
            where = "LLMServingSim's RTX4090 bundle, from --llmservingsim-repo"
            _report("RTX-4090", where, _bundles(root, "RTX4090"), out=fits)
    else:
        print(
            "\nskipped RTX-4090: its bundle is in LLMServingSim's repository (--llmservingsim-repo)"
        )
    gpu = args.servesim_gpu
    if gpu in wanted:
        present = [p for p in args.servesim_profiles if p.is_file()]
        if present:
            where = "servesim's calibrations, linear tables only: " + ", ".join(
                _short(p) for p in present
            )
            try:
                tables = [servesim_table(p) for p in present]
                _report(gpu, where, tables, out=fits)
                _report_own_kernels(gpu, present, out=fits)
            except (OSError, ValueError) as error:  # EfficiencyFitError, a malformed profile
                print(f"derive_efficiencies: {error}", file=sys.stderr)
                return 2
        else:
            print(f"\nskipped {gpu}: no servesim profile found (--servesim-profiles)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fits, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
