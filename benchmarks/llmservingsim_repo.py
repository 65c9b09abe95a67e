"""Reading LLMServingSim's public repository (a checkout, or its git directory) for the
benchmarks: its own predictions of measured runs (``outputs/sim.csv``), and the measured runs
and profile bundles it publishes beyond those in ../shared, copied into a scratch folder (never
into the project) with the workload of the same SHA-256 taken from ../shared."""

from __future__ import annotations

import hashlib
import json
import subprocess
from io import StringIO
from pathlib import Path

import pandas as pd


def _is_git_dir(repo: Path) -> bool:
    return (repo / "HEAD").is_file() and (repo / "objects").is_dir()


def read_bytes(repo: Path, inside: str) -> bytes | None:
    """A file of the repository's HEAD (a git directory) or of the checkout; None if absent."""
    if not _is_git_dir(repo):
        path = repo / inside
        return path.read_bytes() if path.is_file() else None
    shown = subprocess.run(
        ["git", f"--git-dir={repo}", "show", f"HEAD:{inside}"], capture_output=True, check=False
    )
    return shown.stdout if shown.returncode == 0 else None


def list_files(repo: Path, prefix: str) -> list[str]:
    """Paths of the files under ``prefix`` (relative to the repository)."""
    if not _is_git_dir(repo):
        root = repo / prefix
        return sorted(str(p.relative_to(repo)) for p in root.rglob("*") if p.is_file())
    listed = subprocess.run(
        ["git", f"--git-dir={repo}", "ls-tree", "-r", "--name-only", "HEAD", prefix],
        capture_output=True,
        text=True,
        check=False,
    )
    return listed.stdout.split() if listed.returncode == 0 else []


def prediction_rows(repo: Path, gpu: str, model: str) -> pd.DataFrame | None:
    """LLMServingSim's prediction of the run of ``model`` (its last path part) on ``gpu``
    (``bench/examples/<gpu>/<model>/outputs/sim.csv``, times in ns) as request rows."""
    data = read_bytes(repo, f"bench/examples/{gpu}/{model}/outputs/sim.csv")
    if data is None:
        return None
    frame = pd.read_csv(StringIO(data.decode()))
    start = frame["arrival"].min()
    return pd.DataFrame(
        {
            "request_id": [f"bench-{i}" for i in frame["request id"]],
            "status": "finished",
            "ttft_ms": frame["TTFT"] / 1e6,
            "tpot_ms": frame["TPOT"] / 1e6,
            "e2el_ms": frame["latency"] / 1e6,
            "finish_s": (frame["end_time"] - start) / 1e9,
            "output_tokens": frame["output"],
        }
    )


def copy_runs(repo: Path, workloads: Path, have: set[str], out: Path) -> list[str]:
    """Copy the measured runs the repository publishes (``bench/examples/<gpu>/<model>/``) and
    ``have`` lacks into ``out/<gpu>-<model>/`` as run folders (meta.json, requests.jsonl,
    timeseries.csv, config.json), with ``out/workloads/`` holding the workloads of ``workloads``
    whose SHA-256 a run names. Returns what it copied; a run whose workload is missing is left
    out and named as such."""
    by_hash = {
        hashlib.sha256(p.read_bytes()).hexdigest(): p for p in sorted(workloads.glob("*.jsonl"))
    }
    notes = []
    files = [p.split("/") for p in list_files(repo, "bench/examples")]
    examples = sorted({"/".join(parts[:4]) for parts in files if len(parts) > 4})
    for example in examples:
        _, _, gpu, model = example.split("/")
        name = f"{gpu}-{model}"
        meta_bytes = read_bytes(repo, f"{example}/vllm/meta.json")
        if name in have or meta_bytes is None:
            continue
        meta = json.loads(meta_bytes)
        source = by_hash.get(str(meta.get("dataset_hash")))
        if source is None:
            notes.append(
                f"{name}: its workload (sha256 {meta.get('dataset_hash')}) is not in {workloads}"
            )
            continue
        folder = out / name
        folder.mkdir(parents=True)
        meta["dataset_path"] = f"workloads/{source.name}"
        (folder / "meta.json").write_text(json.dumps(meta))
        for inside, local in (
            ("vllm/requests.jsonl", "requests.jsonl"),
            ("vllm/timeseries.csv", "timeseries.csv"),
            ("config.json", "config.json"),
        ):
            data = read_bytes(repo, f"{example}/{inside}")
            if data is not None:
                (folder / local).write_bytes(data)
        (out / "workloads").mkdir(exist_ok=True)
        (out / "workloads" / source.name).write_bytes(source.read_bytes())
        notes.append(f"{name}: copied from the repository, workload {source.name}")
    return notes


def copy_bundles(repo: Path, out: Path) -> Path:
    """Copy the profile bundles the repository publishes (``profiler/perf/``) under ``out``."""
    for inside in list_files(repo, "profiler/perf"):
        data = read_bytes(repo, inside)
        if data is None:
            continue
        target = out / inside.removeprefix("profiler/perf/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return out
