"""The decode kernel's longest walk on a GPU, from a ``python -m engine gpu-check`` folder: where
``HardwareSpec.decode_tile_s`` comes from, and what pricing it changes.

For each run of the engine with CUDA graphs (``engine-self/run*``), its decode-only steps (one
graph replay each: no host launches inside) are fitted by least squares as

    duration = a + b x padded batch + c x tiles of the longest walk (``core.decode_split``)

so ``c / layers`` is one tile's time. Beside it, the same steps' median error by batch size
under the roofline and each calibration of that engine, with the walk priced (the H200's
``decode_tile_s``) and without it (0); both with the calibrations' tables made monotone and
the H200's GEMM efficiencies, as the cost model now reads them.

A run whose kernel split ``"fixed"`` (every run before 39ba127, 2026-11-27) also gets the fit's own
projection of the ``"per_sequence"`` split: each step's walk under it, and ``c`` times the tiles
it would not walk, as a share of the measured time. That is a prediction from the fit, not a
measurement; the kernel benchmark's skewed graph decode (``kernels.bench_graph``) measures it.

    python benchmarks/decode_walk.py benchmarks/results/gpu-h200-2026-11-27/call2 \
        > benchmarks/results/decode_walk.txt
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.decode_split import padded_batch_size  # noqa: E402
from core.model.presets import load_model_spec  # noqa: E402
from fidelity import validation  # noqa: E402
from fidelity.replay_inputs import decode_split_of_run, run_summary  # noqa: E402
from fidelity.validate import engine_cost_config, sim_config  # noqa: E402
from fidelity.validate_config import ValidateConfig  # noqa: E402
from records.run_dir import run_file  # noqa: E402
from records.step_shapes import STEP_SHAPES_FILE, StepShapeRecord, load_step_shapes  # noqa: E402
from sim.costmodel.base import make_cost_model  # noqa: E402
from sim.costmodel.decode_chain import DecodeChain  # noqa: E402
from sim.costmodel.roofline import RooflineCostModel  # noqa: E402
from sim.specs.hardware import get_hardware_preset  # noqa: E402

BINS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 512))
PROFILES = ("profile.json", "profile-repeat2.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", help="a gpu-check output folder (engine-self, calibrate)")
    parser.add_argument("--hardware", default="H200")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--json", type=Path, help="also write the figures here, as data")
    args = parser.parse_args(argv)
    check = Path(args.check)
    started = time.time()
    print(f"# python benchmarks/decode_walk.py {shlex.join(argv or sys.argv[1:])}")
    runs = sorted(p for p in (check / "engine-self").glob("run*") if p.is_dir())
    if not runs:
        print(f"no engine runs under {check / 'engine-self'}")
        return 2
    settings = ValidateConfig(model=args.model, device="cuda", hardware=args.hardware)
    spec, hardware = load_model_spec(args.model), get_hardware_preset(args.hardware)
    layers = spec.num_layers
    figures: dict[str, object] = {
        "hardware": args.hardware,
        "stated_tile_s": hardware.decode_tile_s,
    }
    fitted: dict[str, object] = {}
    figures["runs"] = fitted
    print(f"{args.hardware}: decode_tile_s as stated {hardware.decode_tile_s * 1e6:.2f} us\n")
    for run_dir in runs:
        run = sim_config(run_dir, settings, None)
        split = decode_split_of_run(run_summary(run_dir), run_dir / "summary.json")
        config = engine_cost_config(run, "servesim-graphs", split)
        roofline = RooflineCostModel(spec, hardware, 1, config, block_size=run.cache.block_size)
        chain = roofline.decode_chain
        assert chain is not None
        steps = [
            s
            for s in load_step_shapes(run_file(run_dir, STEP_SHAPES_FILE))
            if not s.prefill_chunks and s.decode_context_tokens
        ]
        measured = np.array([s.duration_s for s in steps])
        batch = np.array([len(s.decode_context_tokens) for s in steps])
        padded = np.array([padded_batch_size(chain.graph_sizes, n) or n for n in batch])
        walks = np.array([chain.tiles(len(s.decode_context_tokens), max(s.decode_context_tokens))
                          for s in steps])  # fmt: skip
        data = np.c_[np.ones(len(steps)), padded, walks]
        coef = np.linalg.lstsq(data, measured, rcond=None)[0]
        fit_error = np.abs(data @ coef / measured - 1)
        print(f"## {run_dir.name}: {len(steps)} decode-only steps (graph replays)")
        print(
            f"fit: a {coef[0] * 1e3:.3f} ms + b {coef[1] * 1e6:.1f} us x padded batch + "
            f"c {coef[2] * 1e6:.1f} us x walk tiles; one tile {coef[2] / layers * 1e6:.2f} us "
            f"a layer; median |error| {100 * np.median(fit_error):.2f}%, "
            f"p90 {100 * np.percentile(fit_error, 90):.2f}%"
        )
        by_model: dict[str, dict[str, float]] = {}
        fitted[run_dir.name] = {
            "decode_only_steps": len(steps),
            "fixed_s": float(coef[0]),
            "per_padded_row_s": float(coef[1]),
            "tile_s": float(coef[2] / layers),
            "fit_median_abs_pct": float(100 * np.median(fit_error)),
            "fit_p90_abs_pct": float(100 * np.percentile(fit_error, 90)),
            "models": by_model,
            "decode_split": split,
        }
        if split == "fixed":
            fitted[run_dir.name]["per_sequence"] = _per_sequence_projection(
                replace(chain, split_mode="per_sequence"), steps, walks, coef[2], measured, batch
            )
        models = {}
        for walk_priced in (False, True):
            hw = hardware if walk_priced else replace(hardware, decode_tile_s=0.0)
            tag = "walk" if walk_priced else "no walk"
            models[f"roofline, {tag}"] = make_cost_model(
                spec, hw, 1, None, config, block_size=run.cache.block_size
            )
            for name in PROFILES:
                profile = check / "calibrate" / name
                if profile.exists():
                    models[f"{name}, {tag}"] = make_cost_model(
                        spec, hw, 1, profile, config, block_size=run.cache.block_size
                    )
        head = "".join(f"{f'{lo}-{hi}':>8}" for lo, hi in BINS)
        print(f"median signed error % by decode batch size{'':14}{head}      all |all|")
        counts = "".join(f"{int(((batch >= lo) & (batch <= hi)).sum()):>8}" for lo, hi in BINS)
        print(f"{'steps':<56}{counts}")
        for name, model in models.items():
            predicted = np.array([model.step_time_s(validation.shape_of(s)) for s in steps])
            error = 100 * (predicted / measured - 1)
            by_model[name] = {
                "median_pct": float(np.median(error)),
                "median_abs_pct": float(np.median(np.abs(error))),
            }
            cells = _bin_cells(error, batch, "+8.1f")
            print(f"{name:<56}{cells}{np.median(error):>+9.1f}{np.median(np.abs(error)):>5.1f}")
        print()
    print(f"# wall time {time.time() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def _bin_cells(values: np.ndarray, batch: np.ndarray, spec: str) -> str:
    """The median of ``values`` in each of ``BINS`` of decode batch size, 8 characters each
    (formatted by ``spec``; "-" for an empty bin)."""
    cells = []
    for lo, hi in BINS:
        inside = (batch >= lo) & (batch <= hi)
        cells.append(format(np.median(values[inside]), spec) if inside.any() else f"{'-':>8}")
    return "".join(cells)


def _per_sequence_projection(
    chain: DecodeChain,
    steps: list[StepShapeRecord],
    walks: np.ndarray,
    tile_s: float,
    measured: np.ndarray,
    batch: np.ndarray,
) -> dict[str, object]:
    """The fit's projection of the same steps under the per-sequence split: the tiles each
    longest walk would lose, priced at the fitted ``tile_s`` (all layers), as a share of the
    measured time; printed by batch size."""
    shorter = np.array([chain.tiles(len(s.decode_context_tokens), max(s.decode_context_tokens))
                        for s in steps])  # fmt: skip
    saved = tile_s * (walks - shorter)
    share = 100 * saved / measured
    total = float(100 * saved.sum() / measured.sum())
    print(
        f"per-sequence split, projected by this fit: longest walk median {np.median(walks):.0f} "
        f"-> {np.median(shorter):.0f} tiles; decode-only time -{total:.1f}% in all, median "
        f"step -{np.median(share):.1f}%"
    )
    cells = _bin_cells(share, batch, "8.1f")
    print(f"{'  median step time saved % by decode batch size':<56}{cells}")
    return {
        "median_walk_tiles": float(np.median(walks)),
        "median_walk_tiles_per_sequence": float(np.median(shorter)),
        "decode_only_time_saved_pct": total,
        "median_step_saved_pct": float(np.median(share)),
    }


if __name__ == "__main__":
    raise SystemExit(main())
