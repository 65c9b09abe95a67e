"""`python -m sim profile import-llmservingsim`: an LLMServingSim per-layer profile bundle
(``meta.yaml`` beside ``tp<N>/dense.csv``, ``per_sequence.csv``, ``attention.csv`` and the skew
fit; vLLM's own kernels timed one layer at a time) turned into our profile format, version 5."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from core.model.presets import preset_for_model_id
from core.model.spec import ModelSpec, check_tp
from sim.costmodel.profile import FORMAT_VERSION
from sim.costmodel.step_attention import ATTENTION_AXES, SKEW_AXES

LINEAR_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""dense.csv layers that make our per-layer ``linear`` op."""
ELEMENTWISE_CALLS = {"layernorm": 2, "qk_norm": 1, "rotary_emb": 1, "act_fn": 1}
"""dense.csv layers that make our per-layer ``elementwise`` op, with how many times a layer runs
each row, as LLMServingSim's architecture files list them (``profiler/models/*.yaml``
``sequence``): the decoder layer's RMSNorm before attention and after it, one ``qk_norm`` row
for Qwen3's query and key norms (which those files say the profiler sums), rotary, activation."""
PER_STEP_LAYERS = ("embedding", "final_layernorm")
"""dense.csv layers that run once a step (spread over the layers in ``elementwise``)."""
PER_SEQUENCE_LAYERS = ("lm_head", "sampler")
"""per_sequence.csv layers; together our ``lm_head`` op (logits and sampling, by sequences)."""
UNKNOWN = "unknown (LLMServingSim profile)"


class ProfileBundleError(ValueError):
    """A file of the bundle is missing or malformed; the message names file, line and column."""


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: text}) for each data row of a CSV that has ``columns``."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise ProfileBundleError(f"{path}: cannot read ({error.strerror or error})") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ProfileBundleError(f"{path}:1: empty file, expected columns {list(columns)}")
        header = [name.strip() for name in header]
        missing = [name for name in columns if name not in header]
        if missing:
            raise ProfileBundleError(f"{path}:1: missing column(s) {missing}; header {header}")
        where = {name: header.index(name) for name in columns}
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ProfileBundleError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}"
                )
            yield reader.line_num, {name: row[i].strip() for name, i in where.items()}


def _value(
    path: Path, line: int, column: str, header: tuple[str, ...], text: str, kind: str
) -> Any:
    """A cell as a non-negative integer (``kind`` "count"), a finite non-negative number
    ("time") or any finite number ("number"); errors name file, line and column."""
    place = f"{path}:{line}: column {header.index(column) + 1} ({column!r})"
    try:
        value: float = int(text) if kind == "count" else float(text)
    except ValueError:
        noun = "an integer" if kind == "count" else "a number"
        raise ProfileBundleError(f"{place}: expected {noun}, got {text!r}") from None
    if not math.isfinite(value) or (kind != "number" and value < 0):
        raise ProfileBundleError(f"{place}: expected a finite non-negative value, got {text!r}")
    return value


def _layer_tables(path: Path, axis: str, known: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """``{layer: {size: seconds}}`` from a ``layer,<axis>,time_us`` file (dense.csv,
    per_sequence.csv); a layer outside ``known`` or a size measured twice is an error."""
    header = ("layer", axis, "time_us")
    tables: dict[str, dict[int, float]] = {}
    for line, row in _rows(path, header):
        layer = row["layer"]
        if layer not in known:
            raise ProfileBundleError(
                f"{path}:{line}: column 1 ('layer'): unknown layer {layer!r}; this importer "
                f"knows {', '.join(known)}"
            )
        size = _value(path, line, axis, header, row[axis], "count")
        if size <= 0:
            raise ProfileBundleError(f"{path}:{line}: column 2 ({axis!r}): must be positive")
        seconds = _value(path, line, "time_us", header, row["time_us"], "time") * 1e-6
        if size in tables.setdefault(layer, {}):
            raise ProfileBundleError(f"{path}:{line}: layer {layer!r} at {size} measured twice")
        tables[layer][size] = seconds
    return tables


def _combine(
    path: Path, tables: dict[str, dict[int, float]], weights: dict[str, float], axis: str
) -> dict[str, list[Any]]:
    """The weighted sum of several layers' tables on the union of their sizes: piecewise
    linear sums are exact there, so interpolating the sum equals summing the interpolations."""
    missing = [layer for layer in weights if layer not in tables]
    if missing:
        raise ProfileBundleError(f"{path}: no rows for layer(s) {missing}")
    ranges = {(min(tables[layer]), max(tables[layer])) for layer in weights}
    if len(ranges) != 1:
        raise ProfileBundleError(f"{path}: layers {sorted(weights)} span different {axis} ranges")
    xs = sorted({x for layer in weights for x in tables[layer]})
    times = np.zeros(len(xs))
    for layer, weight in weights.items():
        sizes = sorted(tables[layer])
        times += weight * np.interp(xs, sizes, [tables[layer][x] for x in sizes])
    return {axis: xs, "time_s": [float(t) for t in times]}


def _attention(path: Path) -> dict[str, list[Any]]:
    """``ops.attention``: the measured points, as columns."""
    header = (*ATTENTION_AXES, "time_us")
    columns: dict[str, list[Any]] = {name: [] for name in (*ATTENTION_AXES, "time_s")}
    seen: dict[tuple[int, ...], int] = {}
    for line, row in _rows(path, header):
        key = tuple(_value(path, line, name, header, row[name], "count") for name in ATTENTION_AXES)
        pc, kp, nd, kvd = key
        if (pc == 0 and kp) or (nd == 0 and kvd) or (pc == 0 and nd == 0):
            raise ProfileBundleError(
                f"{path}:{line}: {dict(zip(ATTENTION_AXES, key, strict=True))}: a context "
                "needs a chunk or decodes to attend over it, and a step needs one of them"
            )
        if key in seen:
            raise ProfileBundleError(f"{path}:{line}: point {list(key)} also on line {seen[key]}")
        seen[key] = line
        for name, value in zip(ATTENTION_AXES, key, strict=True):
            columns[name].append(value)
        columns["time_s"].append(
            _value(path, line, "time_us", header, row["time_us"], "time") * 1e-6
        )
    if not seen:
        raise ProfileBundleError(f"{path}: no rows")
    return columns


def _experts(path: Path, model: ModelSpec) -> dict[str, list[Any]]:
    """``ops.experts`` from moe.csv (``tokens,activated_experts,time_us``: one MoE layer, the
    router and the routed experts, by the tokens entering it and the distinct experts they were
    routed to): a grid of tokens by activated experts. The profiler times only what can happen,
    at most ``k`` experts a token; a cell past that takes its row's largest timed count, so that
    reading between rows never meets a hole (routing never reaches those cells)."""
    header = ("tokens", "activated_experts", "time_us")
    points: dict[tuple[int, int], float] = {}
    for line, row in _rows(path, header):
        tokens, active = (_value(path, line, c, header, row[c], "count") for c in header[:2])
        if tokens <= 0 or not 0 < active <= model.num_experts:
            raise ProfileBundleError(
                f"{path}:{line}: tokens {tokens}, activated_experts {active}: needs tokens >= 1 "
                f"and 1 <= activated_experts <= {model.name}'s {model.num_experts} experts"
            )
        if (tokens, active) in points:
            raise ProfileBundleError(f"{path}:{line}: point {[tokens, active]} measured twice")
        points[tokens, active] = _value(path, line, "time_us", header, row["time_us"], "time")
    if not points:
        raise ProfileBundleError(f"{path}: no rows")
    xs, ys = sorted({t for t, _ in points}), sorted({a for _, a in points})
    grid = []
    for t in xs:
        timed = sorted(a for tt, a in points if tt == t)
        if any(a not in timed for a in ys if a <= timed[-1]):
            raise ProfileBundleError(
                f"{path}: tokens {t} has activated_experts {timed}, a gap below {timed[-1]} in "
                f"the grid {ys}"
            )
        grid.append([points[t, min(a, timed[-1])] * 1e-6 for a in ys])
    return {"num_tokens": xs, "activated_experts": ys, "time_s": grid}


def _meta(root: Path) -> dict[str, Any]:
    """meta.yaml as a mapping; a YAML error names its line and column."""
    import yaml  # only this importer reads YAML

    path = root / "meta.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ProfileBundleError(
            f"{path}: cannot read ({error.strerror or error}); DIR is the folder holding "
            "meta.yaml and tp<N>/"
        ) from None
    try:
        meta = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}: column {mark.column + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or error
        raise ProfileBundleError(f"{where}: not valid YAML ({problem})") from None
    if not isinstance(meta, dict):
        raise ProfileBundleError(f"{path}:1: column 1: expected a mapping at the top level")
    return meta


def _skew(meta: dict[str, Any], root: Path, tp: int) -> dict[str, Any] | None:
    """``decode_skew`` from meta.yaml's ``skew_fit`` for this TP and its bucket table, or
    None when the bundle has no skew fit (then no correction, as LLMServingSim applies)."""
    fit = meta.get("skew_fit")
    if not isinstance(fit, dict) or not fit.get("enabled"):
        return None
    path = root / "meta.yaml"
    per_tp = fit.get("per_tp") or {}
    entry = per_tp.get(tp, per_tp.get(str(tp))) if isinstance(per_tp, dict) else None
    if not isinstance(entry, dict):
        raise ProfileBundleError(f"{path}: skew_fit.per_tp has no entry for tp {tp}")
    axes = entry.get("bucket_axes") or fit.get("bucket_axes")
    if not isinstance(axes, dict):
        raise ProfileBundleError(f"{path}: skew_fit.bucket_axes missing")
    bucket_axes = {}
    for axis in SKEW_AXES:
        for part in ("bins", "labels"):
            if not isinstance(axes.get(f"{axis}_{part}"), list):
                raise ProfileBundleError(f"{path}: skew_fit.bucket_axes.{axis}_{part} missing")
            bucket_axes[f"{axis}_{part}"] = axes[f"{axis}_{part}"]
    default = entry.get("alpha_default", 0.0)
    if isinstance(default, bool) or not isinstance(default, int | float):
        raise ProfileBundleError(f"{path}: skew_fit.per_tp.{tp}.alpha_default: not a number")
    alphas = entry.get("alpha_by_bucket")
    if not alphas:
        table = entry.get("bucket_table")
        if not isinstance(table, str):
            raise ProfileBundleError(f"{path}: skew_fit.per_tp.{tp} has no bucket_table")
        alphas = _skew_table(root / table)
    return {"bucket_axes": bucket_axes, "alpha_default": float(default), "alpha_by_bucket": alphas}


def _skew_table(path: Path) -> dict[str, float]:
    """skew_fit.csv: alpha per bucket key ``pc=<pc>|<n>|<skew rate>|<kv_big>|<kp>``."""
    labels = ("n_label", "skew_rate_label", "kv_big_label", "kp_label")
    header = ("pc", *labels, "alpha")
    alphas: dict[str, float] = {}
    for line, row in _rows(path, header):
        pc = _value(path, line, "pc", header, row["pc"], "count")
        key = "|".join([f"pc={pc}", *(row[name] for name in labels)])
        if key in alphas:
            raise ProfileBundleError(f"{path}:{line}: bucket {key!r} appears twice")
        alphas[key] = _value(path, line, "alpha", header, row["alpha"], "number")
    return alphas


def _check_shape(meta: dict[str, Any], model: ModelSpec, root: Path) -> None:
    """The bundle's one-GPU stand-in for a TP shard (``engine_effective.hf_overrides``: the
    model's widths over one TP degree) must be this model's widths over one of the degrees."""
    overrides = (meta.get("engine_effective") or {}).get("hf_overrides") or {}
    ours = {
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "vocab_size": model.vocab_size,
    }
    if not model.is_moe:  # a MoE config's intermediate_size is not one our ModelSpec keeps
        ours["intermediate_size"] = model.intermediate_size
    ratios = {}
    for key, full in ours.items():
        value = overrides.get(key)
        if isinstance(value, int) and value > 0:
            ratios[key] = full / value
    degrees = set(meta.get("tp_degrees") or []) | {1}
    if ratios and (len(set(ratios.values())) != 1 or next(iter(ratios.values())) not in degrees):
        raise ProfileBundleError(
            f"{root / 'meta.yaml'}: engine_effective.hf_overrides {overrides} are not "
            f"{model.name}'s widths ({ours}) over one TP degree: a profile of another model?"
        )


def _model_name(meta: dict[str, Any], root: Path) -> str:
    """Our preset named by meta.yaml's ``model`` (its last path part, any case)."""
    name = str(meta.get("model") or "")
    preset = preset_for_model_id(name)
    if preset is not None:
        return preset
    raise ProfileBundleError(
        f"{root / 'meta.yaml'}: model {name!r} matches no preset; pass --model (a preset or a "
        "config.json)"
    )


def llmservingsim_profile(
    bundle: str | Path, tp: int, command: str, model: ModelSpec | None = None
) -> dict[str, Any]:
    """The version-5 profile (a JSON-ready dict) of ``model`` (default: the preset meta.yaml
    names) at ``tp`` from an LLMServingSim bundle folder (meta.yaml beside tp<N>/)."""
    root = Path(bundle)
    meta = _meta(root)
    if model is None:
        from core.model.presets import load_model_spec

        model = load_model_spec(_model_name(meta, root))
    check_tp(model, tp)
    _check_shape(meta, model, root)
    folder = root / f"tp{tp}"
    if not folder.is_dir():
        raise ProfileBundleError(
            f"{folder}: no such folder; the bundle has {meta.get('tp_degrees')} (--tp)"
        )
    dense_path = folder / "dense.csv"
    known = (*LINEAR_LAYERS, *ELEMENTWISE_CALLS, *PER_STEP_LAYERS)
    dense = _layer_tables(dense_path, "tokens", known)
    weights = {layer: float(n) for layer, n in ELEMENTWISE_CALLS.items() if layer in dense}
    weights |= {layer: 1 / model.num_layers for layer in PER_STEP_LAYERS}
    per_sequence = _layer_tables(folder / "per_sequence.csv", "sequences", PER_SEQUENCE_LAYERS)
    # A mixture of experts' dense.csv has no MLP projections (shared experts' aside).
    linear = [n for n in LINEAR_LAYERS if n in dense] if model.is_moe else LINEAR_LAYERS
    ops: dict[str, Any] = {
        "linear": _combine(dense_path, dense, dict.fromkeys(linear, 1.0), "num_tokens"),
        "elementwise": _combine(dense_path, dense, weights, "num_tokens"),
        "lm_head": _combine(
            folder / "per_sequence.csv", per_sequence, dict.fromkeys(PER_SEQUENCE_LAYERS, 1.0),
            "num_seqs",
        ),
        "attention": _attention(folder / "attention.csv"),
    }  # fmt: skip
    if model.is_moe:  # a mixture of experts' MLP is its MoE layer, priced from moe.csv alone
        if not (folder / "moe.csv").exists():
            raise ProfileBundleError(
                f"{folder / 'moe.csv'}: missing; {model.name} is a mixture of experts, and "
                "dense.csv times no MoE layer"
            )
        ops["experts"] = _experts(folder / "moe.csv", model)
    elif (folder / "moe.csv").exists():
        raise ProfileBundleError(f"{folder / 'moe.csv'}: {model.name} has no experts")
    engine = meta.get("engine_effective") or {}
    profile: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "device": {
            "name": str(meta.get("gpu") or meta.get("hardware") or UNKNOWN),
            "driver": UNKNOWN,
        },
        "software": {
            "torch": UNKNOWN,
            "triton": UNKNOWN,
            "cuda": str(meta.get("cuda_version") or UNKNOWN),
            "vllm": str(meta.get("vllm_version") or UNKNOWN),
        },
        "command": command,
        "model": model.name,
        "tp": tp,
        "block_size": int(engine.get("block_size") or 16),
        "timer": "kernel_trace",
        "extrapolation": "roofline",
        "engine": {
            # vLLM's kernels: a run prices the host with vLLM's set (docs/host_time.md).
            "kind": "vllm",
            "source": f"LLMServingSim profiler {meta.get('profiler_version', '?')}",
            "enforce_eager": str(engine.get("enforce_eager", UNKNOWN)),
            "measurement_iterations": str(meta.get("measurement_iterations", UNKNOWN)),
        },
        "ops": ops,
    }
    if (skew := _skew(meta, root, tp)) is not None:
        profile["decode_skew"] = skew
    return profile


def write_profile(profile: dict[str, Any], out: str | Path) -> None:
    Path(out).write_text(json.dumps(profile) + "\n")
