"""A run directory: ``write_run_dir`` writes ``requests.csv``, ``steps.csv`` and
``summary.json``; ``load_run`` reads one back as `RunRecords` (config, summary, request and step
frames), and ``records_from_result`` builds the same from an in-memory simulator result."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from core.request import RequestStatus
from core.settings import flat_settings
from records.schema import SUMMED_COLUMNS

UNKNOWN = "unknown"


@dataclass(frozen=True)
class RunRecords:
    """One run as a report sees it. ``requests`` and ``steps`` are the frames that
    ``requests.csv`` and ``steps.csv`` hold (latencies in ms, times in s)."""

    label: str
    config: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    trace_name: str = UNKNOWN
    memory_model: str = UNKNOWN
    num_blocks: int | None = None
    mean_real_token_share: float | None = None
    command: str | None = None
    version: str | None = None
    trace_stats: dict[str, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    source: str | None = None
    # What ran it, where the config alone cannot say: the device (and dtype) of an engine run,
    # or a hardware file's own name; and where its times come from when no cost model priced
    # them (an engine run, an imported measured run). None: the config's hardware, simulated.
    hardware: str | None = None
    timing: str | None = None


def default_label(config: dict[str, Any], memory_model: str) -> str:
    """``policy / memory`` plus the reservation rule for contiguous memory."""
    label = f"{config.get('policy', UNKNOWN)} / {memory_model}"
    if memory_model == "contiguous":
        label += f" ({config.get('reservation', UNKNOWN)})"
    return label


def _installed_version() -> str | None:
    try:
        return metadata.version("servesim")
    except metadata.PackageNotFoundError:
        return None


def write_run_dir(
    out: str | Path, requests: pd.DataFrame, steps: pd.DataFrame, payload: dict[str, Any]
) -> None:
    """Write one run: ``requests`` (``schema.request_frame``), ``steps``
    (``schema.StepRecorder.to_frame``) and ``payload`` as ``summary.json``. The payload holds
    at least ``summary`` (``metrics.summarize``) and ``config``; ``load_run`` reads the keys
    ``trace``, ``memory_model``, ``num_blocks``, ``notes``, ``mean_real_token_share``,
    ``trace_stats``, ``command`` and ``servesim_version`` when present. Both the simulator and
    the real engine write through here."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    requests.to_csv(root / "requests.csv", index=False)
    steps.to_csv(root / "steps.csv", index=False)
    (root / "summary.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def run_file(root: str | Path, name: str) -> Path:
    """``root / name``, or its gzip-compressed ``name.gz`` when only that is there (recorded
    runs are kept compressed and read as they are); the plain name when neither is."""
    plain = Path(root) / name
    packed = plain.with_name(plain.name + ".gz")
    return packed if not plain.exists() and packed.exists() else plain


def load_run(run_dir: str | Path, label: str | None = None) -> RunRecords:
    """Read a directory written by ``RunResult.write``: summary.json, requests.csv, steps.csv.

    Optional summary.json keys ``command``, ``servesim_version`` and ``trace_stats`` are read
    when present. The CSV files may be gzip-compressed (``run_file``)."""
    root = Path(run_dir)
    summary_path = root / "summary.json"
    if root.is_file():
        raise ValueError(f"{root}: a file, not a run directory (a run's --out folder)")
    if not root.is_dir():
        raise ValueError(f"{root}: no such run directory")
    if not summary_path.is_file():
        raise ValueError(
            f"{root}: not a run directory (it holds no summary.json; a run's --out folder does)"
        )
    try:
        payload = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{summary_path}:{error.lineno}: not valid JSON ({error.msg} at column {error.colno})"
        ) from None
    except UnicodeDecodeError:
        raise ValueError(f"{summary_path}: not a servesim run summary (not UTF-8 text)") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("summary"), dict):
        raise ValueError(f"{summary_path} is not a servesim run summary")
    config = dict(payload.get("config") or {})
    memory_model = str(payload.get("memory_model") or config.get("memory_model") or UNKNOWN)
    share = payload.get("mean_real_token_share")
    stats = payload.get("trace_stats")
    if label is None:
        label = default_label(config, memory_model)
        if payload.get("executor") == "engine":
            label = f"engine: {label}"
    return RunRecords(
        label=label,
        config=config,
        summary=dict(payload["summary"]),
        requests=_requests(root, payload["summary"].get("num_requests")),
        steps=per_step(read_run_csv(root, "steps.csv", text_columns=("pool",))),
        trace_name=str(payload.get("trace", UNKNOWN)),
        memory_model=memory_model,
        num_blocks=payload.get("num_blocks"),
        mean_real_token_share=float(share) if share is not None else None,
        command=payload.get("command"),
        version=payload.get("servesim_version"),
        trace_stats=dict(stats) if isinstance(stats, dict) else None,
        notes=tuple(str(n) for n in payload.get("notes") or ()),
        source=str(root),
        hardware=hardware_text(payload, config),
        timing=timing_text(payload),
    )


# The columns of requests.csv that hold text; every other column holds numbers.
_REQUEST_TEXT_COLUMNS = ("request_id", "status", "reject_reason")
_STATUSES = tuple(status.value for status in RequestStatus)


def read_run_csv(root: Path, name: str, text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """One CSV file of the run directory ``root``, every column but ``text_columns`` numbers;
    a missing, empty or damaged file is a ``ValueError`` naming the file (and the line and
    column of the first bad value)."""
    path = run_file(root, name)
    if not path.is_file():
        raise ValueError(
            f"{root}: {name} is missing (a run directory holds summary.json, requests.csv and "
            "steps.csv)"
        )
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty (not a run's {name})") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as error:
        raise ValueError(f"{path}: not a run's {name} ({error})") from None
    for column in frame.columns:
        if column in text_columns or pd.api.types.is_numeric_dtype(frame[column]):
            continue
        numbers = pd.to_numeric(frame[column], errors="coerce")
        bad = numbers.isna() & frame[column].notna()
        if not bad.any():  # (a column with no values at all reads as text)
            continue
        row = int(bad.to_numpy().argmax())
        # (line 1 is the header)
        raise ValueError(f"{path}:{row + 2}: {column}: not a number: {frame[column].iloc[row]!r}")
    return frame


def _requests(root: Path, num_requests: object) -> pd.DataFrame:
    """requests.csv, its statuses known and as many rows as summary.json counts requests."""
    frame = read_run_csv(root, "requests.csv", _REQUEST_TEXT_COLUMNS)
    path = run_file(root, "requests.csv")
    if "status" in frame.columns:
        unknown = ~frame["status"].isin(_STATUSES)
        if unknown.any():
            row = int(unknown.to_numpy().argmax())
            raise ValueError(
                f"{path}:{row + 2}: status: {frame['status'].iloc[row]!r} is not a request "
                f"status (one of {', '.join(_STATUSES)})"
            )
    if isinstance(num_requests, int) and len(frame) != num_requests:
        raise ValueError(
            f"{path}: {len(frame)} requests, but summary.json counts {num_requests}: the file "
            "was cut short or is not this run's"
        )
    return frame


def hardware_text(payload: dict[str, Any], config: dict[str, Any]) -> str | None:
    """The hardware as summary.json states it beyond ``config.hardware``: an engine run's
    device and dtype, or the ``name`` inside a hardware file (None: neither is recorded)."""
    if payload.get("executor") == "engine":
        device = str(payload.get("device_name") or config.get("device") or UNKNOWN)
        dtype = payload.get("dtype") or config.get("dtype")
        return f"{device}, {dtype}" if dtype else f"{device}, dtype not recorded"
    name = payload.get("hardware_name")
    return f"{name} ({config.get('hardware', UNKNOWN)})" if name else None


def timing_text(payload: dict[str, Any]) -> str | None:
    """Where the run's times come from when they were measured, not priced (None: priced by
    the simulator's cost model)."""
    if payload.get("executor") == "engine":
        clock = payload.get("clock", "wall")
        timeline = "thread-CPU time, a virtual timeline" if clock == "cpu" else "the wall clock"
        return f"measured: the real engine's steps, on {timeline}"
    measured = payload.get("measured")
    if isinstance(measured, dict):
        return f"measured: a {measured.get('format', UNKNOWN)} run, imported"
    return None


def per_step(steps: pd.DataFrame) -> pd.DataFrame:
    """Turn rows that cover ``num_steps`` identical decode steps (the simulator skips over
    them at once) into per-step means, so every row reads as one typical step."""
    if "num_steps" not in steps.columns:
        return steps
    out = steps.copy()
    n = out["num_steps"].to_numpy(float)
    for column in SUMMED_COLUMNS:
        if column != "num_steps" and column in out.columns:
            out[column] = out[column].to_numpy(float) / n
    return out


def records_from_result(
    result: Any, label: str | None = None, command: str | None = None, source: str | None = None
) -> RunRecords:
    """Build `RunRecords` from an in-memory ``sim.run.RunResult`` (duck-typed: config,
    trace_name, memory_model, num_blocks, summary, requests_frame(), steps.to_frame(),
    mean_real_token_share, and trace_stats when present) without writing files; ``source``
    names the run directory it was also written to, if any."""
    raw = result.config
    config = flat_settings(raw) if is_dataclass(raw) and not isinstance(raw, type) else dict(raw)
    memory_model = str(result.memory_model)
    share = result.mean_real_token_share
    stats = getattr(result, "trace_stats", None)
    return RunRecords(
        label=label or default_label(config, memory_model),
        config=config,
        summary=dict(result.summary),
        requests=result.requests_frame(),
        steps=per_step(result.steps.to_frame()),
        trace_name=str(result.trace_name),
        memory_model=memory_model,
        num_blocks=int(result.num_blocks),
        mean_real_token_share=None if share is None else float(share),
        command=command,
        version=_installed_version(),
        # The trace's own statistics: requests.csv shows rejected requests with 0 outputs.
        trace_stats=dict(stats) if stats else None,
        notes=tuple(str(n) for n in getattr(result, "notes", ())),
        source=source,
        hardware=hardware_text({"hardware_name": getattr(result, "hardware_name", None)}, config),
    )
