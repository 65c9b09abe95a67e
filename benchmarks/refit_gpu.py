"""A ``python -m engine gpu-check`` folder's calibrations with their host clock fitted again by
the current sources: a GPU profile stores the host clock ``sim calibrate`` fitted to its whole
steps (``host``), and the simulator uses it as stored, so a change to the fit
(``sim.costmodel.host_fit``) shows only in new calibrations. This copies the folder, drops each
profile's stored fit and fits it again from the same steps as ``sim calibrate`` does
(``fidelity.calibrate.step_fit_report``), prints each fit before and after, then runs
``benchmarks/validate_gpu_check.py`` on the copy.

    python benchmarks/refit_gpu.py benchmarks/results/gpu-h200-2026-11-28/call1 \
        > benchmarks/results/gpu-h200-2026-11-28/refit_gpu_call1.txt
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fidelity.calibrate import step_fit_report  # noqa: E402

SHOWN = (
    "step_s",
    "seq_s",
    "layer_s",
    "attention_launch_s",
    "graph_replay_s",
    "piece_replay_s",
    "overlap_loss",
    "stall_share",
    "device_scale",
)


def _host_line(host: dict[str, Any]) -> str:
    """The fitted terms: seconds in microseconds, the rest as they are."""
    cells = []
    for key in SHOWN:
        if key not in host:
            continue
        value = float(host[key])
        cells.append(
            f"{key[:-2]} {1e6 * value:.1f} us" if key.endswith("_s") else f"{key} {value:.3f}"
        )
    return ", ".join(cells)


def refit(folder: Path) -> list[str]:
    """Each ``calibrate*/profile*.json`` under ``folder`` fitted again in place; the lines
    saying each fit before and after."""
    lines = []
    for path in sorted(folder.glob("calibrate*/profile*.json")):
        if path.name.endswith("-repeats.json"):
            continue
        data = json.loads(path.read_text())
        stored = data.pop("host", None)
        if stored is None:
            lines.append(f"{path.relative_to(folder)}: no stored host clock (fitted on load)")
            continue
        data.pop("step_residuals", None)
        data.pop("step_spread", None)
        path.write_text(json.dumps(data, indent=1) + "\n")
        data.update(step_fit_report(path, "cuda"))
        path.write_text(json.dumps(data, indent=1) + "\n")
        lines.append(f"{path.relative_to(folder)}")
        lines.append(f"  stored: {_host_line(stored)}")
        lines.append(f"  refit:  {_host_line(data['host'])}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", help="a gpu-check output folder (calibrate*, engine-self*)")
    args = parser.parse_args(argv)
    check = Path(args.check)
    if not check.is_dir():
        print(f"refit_gpu.py: {check}: no such folder", file=sys.stderr)
        return 2
    started = time.time()
    print(f"# python benchmarks/refit_gpu.py {shlex.join(argv or sys.argv[1:])}")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / check.name
        shutil.copytree(check, copy)
        lines = refit(copy)
        if not lines:
            print(f"refit_gpu.py: {check}: no calibrate*/profile*.json in it", file=sys.stderr)
            return 2
        print("\n".join(lines))
        import validate_gpu_check

        print(f"\n# validate_gpu_check.py on the refitted copy of {check}")
        found = validate_gpu_check.main([str(copy)])
    print(f"\n# wall time {time.time() - started:.0f} s")
    return found


if __name__ == "__main__":
    raise SystemExit(main())
