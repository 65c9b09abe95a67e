"""Lay Vidur's A100 profiling tables (``../shared/profiles/vidur``) out as the local HuggingFace
dataset cache that vidur 0.0.26 reads, so that it runs offline (``HF_HUB_OFFLINE=1``).
Usage: python make_cache.py [CACHE_DIR] (default /tmp/vidur/cache)."""

from __future__ import annotations

import json
import lzma
import shutil
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared" / "profiles" / "vidur"
REVISION = "0" * 40


def add_dataset(cache: Path, kind: str, repo_id: str, files: dict[str, Path], config: dict) -> None:
    base = cache / "profiling_data" / kind / f"datasets--{repo_id.replace('/', '--')}"
    snapshot = base / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(REVISION)
    for name, source in files.items():
        if not source.is_file():
            sys.exit(f"make_cache.py: {source} is missing (Vidur's profiling tables, ../shared)")
        with source.open("rb") as src, lzma.open(snapshot / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    (snapshot / "config.json").write_text(json.dumps(config))


def main() -> None:
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/vidur/cache")
    model = SHARED / "compute" / "a100" / "meta-llama"
    add_dataset(
        cache,
        "compute",
        "local/a100-llama-2-70b-hf",
        {
            "mlp.csv.xz": model / "Llama-2-70b-hf" / "mlp.csv",
            "attention.csv.xz": model / "Llama-2-70b-hf-tp2-attention-e2d00e9" / "attention.csv",
        },
        {"model": "meta-llama/Llama-2-70b-hf", "device_sku": "a100"},
    )
    add_dataset(
        cache,
        "network",
        "local/a100-pairwise-nvlink",
        {"all_reduce.csv.xz": SHARED / "network" / "a100_pairwise_nvlink" / "all_reduce.csv"},
        {"sku": "a100_pairwise_nvlink"},
    )
    print(f"profiling data cached under {cache}")


if __name__ == "__main__":
    main()
