"""What piecewise CUDA graphs for the steps with a prompt chunk (``python -m engine run
--mixed-graphs piecewise``) should save on a GPU check's engine runs: a projection by the
roofline's host clock, not a measurement.

For each ``engine-self`` run of a ``gpu-check`` folder (the engine with decode graphs, its
other steps eager), it prices every recorded step twice with the roofline: as run
(``servesim-graphs``) and with piecewise graphs (``servesim-piecewise``, docs/host_time.md).
It prints, by kind of step, the measured median beside both prices, and what the run's steps
would sum to. Then it simulates the run's trace under both kinds and prints median TTFT, TPOT
and E2E beside the measured ones. The roofline's price of the steps as run is the check on
the projection: where it misses the measured steps, the projection is off by as much.

    python benchmarks/project_piecewise.py benchmarks/results/gpu-h200-2026-11-27/call2
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.model.presets import load_model_spec
from fidelity.replay_inputs import decode_split_of_run, run_summary, trace_of
from fidelity.validate import engine_cost_config, sim_config, subset
from fidelity.validate_config import ValidateConfig
from records.run_dir import load_run, run_file
from records.step_shapes import STEP_SHAPES_FILE, StepShapeRecord, load_step_shapes
from sim.costmodel.roofline import RooflineCostModel
from sim.run import simulate
from sim.specs.hardware import get_hardware_preset
from traces.loaders import load_trace

KINDS = ("servesim-graphs", "servesim-piecewise")


def step_kind(step: StepShapeRecord, max_tokens: int) -> str:
    if not step.prefill_chunks:
        return "decode-only"
    tokens = len(step.decode_context_tokens) + sum(n for n, _ in step.prefill_chunks)
    return f"chunk, <= {max_tokens} tokens" if tokens <= max_tokens else f"chunk, > {max_tokens}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", type=Path, help="a gpu-check folder with engine-self/run*")
    parser.add_argument("--hardware", default="H200")
    parser.add_argument("--model", default="llama-3-8b")
    args = parser.parse_args(argv)
    started = time.time()
    print(f"# python benchmarks/project_piecewise.py {shlex.join(argv or sys.argv[1:])}")
    runs = sorted(p for p in (args.check / "engine-self").glob("run*") if p.is_dir())
    if not runs:
        print(f"no engine runs under {args.check / 'engine-self'}")
        return 2
    spec, hardware = load_model_spec(args.model), get_hardware_preset(args.hardware)
    settings = ValidateConfig(model=args.model, device="cuda", hardware=args.hardware)
    for run_dir in runs:
        summary = run_summary(run_dir)
        run = sim_config(run_dir, settings, None)
        split = decode_split_of_run(summary, run_dir / "summary.json")
        configs = {kind: engine_cost_config(run, kind, split) for kind in KINDS}
        models = {
            kind: RooflineCostModel(spec, hardware, 1, config, block_size=run.cache.block_size)
            for kind, config in configs.items()
        }
        max_tokens = models["servesim-piecewise"].host.params.piecewise_max_tokens
        steps = load_step_shapes(run_file(run_dir, STEP_SHAPES_FILE))
        print(f"\n## {run_dir.name}: {len(steps)} steps, decode split {split}")
        print(
            f"{'steps':<22}{'n':>6}{'measured':>10}{'graphs':>9}{'piecewise':>11}"
            f"{'sum measured':>14}{'sum graphs':>12}{'sum piecewise':>15}"
        )
        kinds = sorted({step_kind(s, max_tokens) for s in steps})
        for kind in kinds:
            chosen = [s for s in steps if step_kind(s, max_tokens) == kind]
            measured = [s.duration_s for s in chosen]
            priced = {k: [m.step_time_s(s) for s in chosen] for k, m in models.items()}
            medians = [statistics.median(v) * 1e3 for v in (measured, *priced.values())]
            sums = [sum(v) for v in (measured, *priced.values())]
            print(
                f"{kind:<22}{len(chosen):>6}{medians[0]:>8.2f}ms{medians[1]:>7.2f}ms"
                f"{medians[2]:>9.2f}ms{sums[0]:>12.2f} s{sums[1]:>10.2f} s{sums[2]:>13.2f} s"
            )
        # How much the projection leans on the estimated replay cost (docs/host_time.md).
        small = [s for s in steps if step_kind(s, max_tokens).startswith("chunk, <=")]
        base = configs["servesim-piecewise"].host_params()
        cells = []
        for replay_us in (10, 30, 100, 300):
            params = replace(base, piece_replay_s=replay_us * 1e-6)
            model = RooflineCostModel(
                spec, hardware, 1, replace(configs["servesim-piecewise"], host=params),
                block_size=run.cache.block_size,
            )  # fmt: skip
            median = statistics.median(model.step_time_s(s) for s in small) * 1e3
            cells.append(f"{replay_us} us: {median:.2f} ms")
        print(f"{'  a piece replay at':<22}" + ", ".join(cells))
        trace = load_trace(trace_of(run_dir, summary))
        scaled = subset(trace, None, float(load_run(run_dir).config.get("time_scale", 1.0)))
        measured_requests = load_run(run_dir).requests
        print(f"{'requests (median ms)':<22}{'TTFT':>9}{'TPOT':>9}{'E2E':>10}")
        rows = {"measured": measured_requests}
        for kind, config in configs.items():
            result = simulate(scaled, replace(run, profile=None), cost_config=config)
            rows[f"roofline {kind.removeprefix('servesim-')}"] = result.requests_frame()
        for name, frame in rows.items():
            ttft, tpot, e2e = (
                float(frame[c].dropna().median()) for c in ("ttft_ms", "tpot_ms", "e2el_ms")
            )
            print(f"{name:<22}{ttft:>9.2f}{tpot:>9.2f}{e2e:>10.1f}")
    print(f"\n# wall time {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
