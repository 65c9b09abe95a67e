"""The GPU check's first part: the machine and software the check runs on, written as JSON
(``python -m engine.gpu_check.environment --out FILE``), and the simulator's hardware preset
that matches the device (``hardware_preset``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata, util
from pathlib import Path
from typing import Any

from engine.affinity import current_cores

# Modules the parts use beyond the standard library; which are missing decides what is skipped.
MODULES = (
    "torch", "triton", "numpy", "pandas", "safetensors", "simpy", "plotly", "tqdm", "pytest",
    "hypothesis", "xdist",
)  # fmt: skip


def installed_modules() -> dict[str, bool]:
    return {name: util.find_spec(name) is not None for name in MODULES}


def hardware_preset(device_name: str, total_bytes: int = 0) -> str | None:
    """The ``sim`` hardware preset of an NVIDIA device's name, None for any other device."""
    if "H200" in device_name:
        return "H200"
    if "H100" in device_name:
        return "H100-SXM"
    if "A100" in device_name:
        return "A100-80GB" if total_bytes > 60 * (1 << 30) else "A100-40GB"
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit(root: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def describe(root: Path) -> dict[str, Any]:
    """The device (through torch), the software versions and the modules present."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        # The cores this process may use (a container may allow fewer than the machine has):
        # engine-pinned-eager pins to two of them.
        "cpu_cores": list(current_cores() or ()),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "commit": _git_commit(root),
        "modules": installed_modules(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            device_count=torch.cuda.device_count(),
            total_memory_bytes=int(props.total_memory),
            hardware=hardware_preset(props.name, int(props.total_memory)),
        )
    else:
        info.update(device="cpu", device_count=0, total_memory_bytes=0, hardware=None)
    return info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.gpu_check.environment",
        description="Describe the device and software as JSON (the GPU check's first part).",
    )
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    info = describe(Path(__file__).resolve().parents[2])
    Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
