"""Readers for Vidur's measured profile CSVs (`mlp.csv`, `all_reduce.csv`, `attention.csv`):
checked rows in seconds, and the lookup of the files in a Vidur profile directory that fit a
model by its shape. Every error names the file, and the line and column where there is one."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from core.model.spec import ModelSpec

MLP_OPS: tuple[str, ...] = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""The per-layer ops of `mlp.csv` (Vidur also times `emb` once per step)."""

_MLP_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "num_tokens")
_MLP_TP = "num_tensor_parallel_workers"
_ALLREDUCE_COLUMNS = ("size", "num_workers", "devices_per_node")
_ATTENTION_SHAPE = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
)


class VidurFileError(ValueError):
    """A Vidur CSV that is missing, unreadable or malformed."""


@dataclass(frozen=True, slots=True)
class MlpRow:
    """One `mlp.csv` row: the shape and each op's median time, per rank, in seconds."""

    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    num_tokens: int
    tp: int
    op_s: dict[str, float]


@dataclass(frozen=True, slots=True)
class AllReduceRow:
    """One all-reduce: `size` bytes per rank over `num_workers` GPUs, `devices_per_node` a node."""

    size_bytes: int
    num_workers: int
    devices_per_node: int
    time_s: float


@dataclass(frozen=True, slots=True)
class AttentionRow:
    """One attention measurement for a whole batch, per layer and rank. Prefill rows hold one
    sequence's chunk of `prefill_chunk_size` new tokens after `kv_cache_size` cached ones;
    decode rows hold `batch_size` sequences at `kv_cache_size` tokens each."""

    n_embd: int
    n_q_head: int
    n_kv_head: int
    block_size: int
    tp: int
    batch_size: int
    prefill_chunk_size: int
    kv_cache_size: int
    is_prefill: bool
    time_s: float


class _CsvReader:
    """Rows of one CSV as dicts, with errors that name the file, line and column."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open(newline="") as handle:
                reader = csv.DictReader(handle)
                self.columns = tuple(reader.fieldnames or ())
                self.rows = [(i + 2, row) for i, row in enumerate(reader)]
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            raise VidurFileError(f"{path}: cannot read as CSV ({error})") from error
        if not self.rows:
            raise VidurFileError(f"{path}: no data rows")

    def require(self, columns: tuple[str, ...]) -> None:
        for column in columns:
            if column not in self.columns:
                raise VidurFileError(f"{self.path}: missing column {column!r}")

    def number(self, line: int, row: dict[str, str | None], column: str) -> float:
        text = row.get(column)
        try:
            value = float(text) if text is not None else float("nan")
        except ValueError:
            value = float("nan")
        if not value == value or value in (float("inf"), float("-inf")) or value < 0:
            raise VidurFileError(
                f"{self.path}: line {line}: column {column!r}: expected a finite non-negative "
                f"number, got {text!r}"
            )
        return value

    def count(self, line: int, row: dict[str, str | None], column: str) -> int:
        value = self.number(line, row, column)
        if value != int(value):
            raise VidurFileError(
                f"{self.path}: line {line}: column {column!r}: expected a whole number, "
                f"got {row.get(column)!r}"
            )
        return int(value)

    def flag(self, line: int, row: dict[str, str | None], column: str) -> bool:
        text = (row.get(column) or "").strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise VidurFileError(
                f"{self.path}: line {line}: column {column!r}: expected True or False, "
                f"got {row.get(column)!r}"
            )
        return text in ("true", "1")

    def millis(self, line: int, row: dict[str, str | None], op: str) -> float:
        return self.number(line, row, f"time_stats.{op}.median") / 1e3


def read_mlp_csv(path: str | Path) -> list[MlpRow]:
    """Rows of a Vidur `mlp.csv`; ops whose median column is absent are left out of `op_s`."""
    reader = _CsvReader(Path(path))
    reader.require((*_MLP_SHAPE, _MLP_TP))
    ops = [op for op in MLP_OPS if f"time_stats.{op}.median" in reader.columns]
    if not ops:
        raise VidurFileError(f"{path}: missing column 'time_stats.<op>.median' for every op")
    rows = []
    for line, row in reader.rows:
        shape = {column: reader.count(line, row, column) for column in _MLP_SHAPE}
        rows.append(
            MlpRow(
                **shape,
                tp=reader.count(line, row, _MLP_TP),
                op_s={op: reader.millis(line, row, op) for op in ops},
            )
        )
    return rows


def read_allreduce_csv(path: str | Path) -> list[AllReduceRow]:
    """Rows of a Vidur `all_reduce.csv` (other collectives, if any, are skipped by name)."""
    reader = _CsvReader(Path(path))
    reader.require((*_ALLREDUCE_COLUMNS, "time_stats.all_reduce.median"))
    rows = []
    for line, row in reader.rows:
        if row.get("collective", "all_reduce") != "all_reduce":
            continue
        size, workers, per_node = (reader.count(line, row, c) for c in _ALLREDUCE_COLUMNS)
        rows.append(AllReduceRow(size, workers, per_node, reader.millis(line, row, "all_reduce")))
    return rows


def read_attention_csv(path: str | Path) -> list[AttentionRow]:
    """Rows of a Vidur `attention.csv`: `attn_prefill` for prefill rows, `attn_decode` else."""
    reader = _CsvReader(Path(path))
    reader.require(
        (
            *_ATTENTION_SHAPE,
            "is_prefill",
            "time_stats.attn_prefill.median",
            "time_stats.attn_decode.median",
        )
    )
    rows = []
    for line, row in reader.rows:
        n = {column: reader.count(line, row, column) for column in _ATTENTION_SHAPE}
        is_prefill = reader.flag(line, row, "is_prefill")
        op = "attn_prefill" if is_prefill else "attn_decode"
        rows.append(
            AttentionRow(
                n_embd=n["n_embd"],
                n_q_head=n["n_q_head"],
                n_kv_head=n["n_kv_head"],
                block_size=n["block_size"],
                tp=n["num_tensor_parallel_workers"],
                batch_size=n["batch_size"],
                prefill_chunk_size=n["prefill_chunk_size"],
                kv_cache_size=n["kv_cache_size"],
                is_prefill=is_prefill,
                time_s=reader.millis(line, row, op),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class VidurFiles:
    """The files of one Vidur profile directory that describe one model on one GPU kind."""

    gpu: str
    mlp: Path | None
    attention: Path | None
    networks: dict[str, Path]  # node type (e.g. "dgx", "pairwise_nvlink") -> all_reduce.csv


def _first_row(path: Path, columns: tuple[str, ...]) -> dict[str, str]:
    reader = _CsvReader(path)
    reader.require(columns)
    line, row = reader.rows[0]
    return {column: str(reader.count(line, row, column)) for column in columns}


def _fits(model: ModelSpec, row: dict[str, str], heads_key: str, inter: bool) -> bool:
    wanted = {
        heads_key: model.num_heads,
        "n_kv_head": model.num_kv_heads,
        "n_embd": model.hidden_size,
    }
    if inter:
        wanted["n_expanded_embd"] = model.intermediate_size
    return all(int(row[key]) == value for key, value in wanted.items())


def find_vidur_files(vidur_dir: str | Path, model: ModelSpec, gpu: str | None = None) -> VidurFiles:
    """Pick, by the model's shape (heads, KV heads, hidden and MLP widths; the closest vocab
    when several fit), the `mlp.csv` and `attention.csv` under `compute/<gpu>/`, and every
    `network/<gpu>_<node type>/all_reduce.csv`. Only files present are returned."""
    root = Path(vidur_dir)
    if not root.is_dir():
        raise VidurFileError(f"{root}: not a directory")
    compute = root / "compute"
    gpus = sorted(p.name for p in compute.iterdir() if p.is_dir()) if compute.is_dir() else []
    networks_root = root / "network"
    if gpu is None:
        net_gpus = (
            {p.name.split("_")[0] for p in networks_root.iterdir() if p.is_dir()}
            if networks_root.is_dir()
            else set()
        )
        found = sorted(set(gpus) | net_gpus)
        if len(found) != 1:
            raise VidurFileError(
                f"{root}: expected files for exactly one GPU, found {found or 'none'}; "
                "pass --gpu to choose"
            )
        gpu = found[0]
    elif gpus and gpu not in gpus:
        raise VidurFileError(
            f"{root}: no measured ops for --gpu {gpu!r} (compute/ holds {', '.join(gpus)})"
        )
    mlp_candidates = []
    attention = None
    for path in sorted((compute / gpu).rglob("mlp.csv")):
        row = _first_row(path, _MLP_SHAPE)
        if _fits(model, row, "n_head", inter=True):
            mlp_candidates.append((abs(int(row["vocab_size"]) - model.vocab_size), str(path)))
    for path in sorted((compute / gpu).rglob("attention.csv")):
        row = _first_row(path, ("n_embd", "n_q_head", "n_kv_head"))
        if attention is None and _fits(model, row, "n_q_head", inter=False):
            attention = path
    networks = {}
    if networks_root.is_dir():
        for folder in sorted(networks_root.iterdir()):
            path = folder / "all_reduce.csv"
            if folder.name.startswith(f"{gpu}_") and path.is_file():
                networks[folder.name[len(gpu) + 1 :]] = path
    mlp = Path(min(mlp_candidates)[1]) if mlp_candidates else None
    return VidurFiles(gpu, mlp, attention, networks)
