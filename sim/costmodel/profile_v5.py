"""Reading what profile format version 5 added (docs/profile_format.md): the engine's fitted
host clock (``host``), which clock gives the GPU time, what the tables time, each table point's
spread, the whole steps' spread, and the commit timed."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.costmodel.host_time import HOST_SECONDS, HostParams

Fail = Callable[[str, str], ValueError]
GPU_CLOCKS = ("tables", "roofline")
TABLES_TIMES = ("span", "device")
# Every field of HostParams, by kind: what `sim calibrate` stores (``asdict``) must load back.
HOST_NUMBERS = (*HOST_SECONDS, "overlap_loss", "stall_share")
HOST_COUNTS = ("split_programs", "split_min_context", "piecewise_max_tokens")
HOST_FLAGS = ("async_scheduling", "cuda_graphs", "piecewise_graphs")


def _number(value: Any, field: str, fail: Fail) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(field, f"expected a finite number, got {value!r}")
    return float(value)


def read_host(obj: Any, fail: Fail) -> tuple[HostParams, float]:
    """The ``host`` object: HostParams' fields and the ``device_scale`` fitted with them."""
    if not isinstance(obj, dict):
        raise fail("host", f"expected an object, got {obj!r}")
    known = {*HOST_NUMBERS, *HOST_COUNTS, *HOST_FLAGS, "device_scale"}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise fail(f"host.{unknown[0]}", f"unknown key; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key in HOST_NUMBERS:
        if key in obj:
            values[key] = _number(obj[key], f"host.{key}", fail)
    for key in HOST_COUNTS:
        if key in obj:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise fail(f"host.{key}", f"expected a count, got {value!r}")
            values[key] = value
    for key in HOST_FLAGS:
        if key in obj:
            if not isinstance(obj[key], bool):
                raise fail(f"host.{key}", f"expected true or false, got {obj[key]!r}")
            values[key] = obj[key]
    scale = _number(obj.get("device_scale", 1.0), "host.device_scale", fail)
    if scale <= 0:
        raise fail("host.device_scale", f"must be positive, got {scale!r}")
    try:
        return HostParams(**values), scale
    except ValueError as error:
        raise fail("host", str(error)) from None


def _choice(data: dict[str, Any], key: str, choices: tuple[str, ...], fail: Fail) -> str | None:
    if key not in data:
        return None
    value = data[key]
    if value not in choices:
        raise fail(key, f"must be one of {choices}, got {value!r}")
    return str(value)


def _spreads(ops: dict[str, Any], fail: Fail) -> dict[str, Any]:
    """``spread_s`` of each op table: as many values as its ``time_s``, each finite, >= 0."""
    out: dict[str, Any] = {}
    for op, table in ops.items():
        if not isinstance(table, dict) or "spread_s" not in table:
            continue
        field = f"ops.{op}.spread_s"
        spread, times = table["spread_s"], table.get("time_s")
        if not isinstance(spread, list) or not isinstance(times, list):
            raise fail(field, "expected a list like time_s")
        if len(spread) != len(times):
            raise fail(field, f"needs {len(times)} entries like time_s, got {len(spread)}")
        flat = [v for row in spread for v in (row if isinstance(row, list) else [row])]
        for value in flat:
            if _number(value, field, fail) < 0:
                raise fail(field, f"expected values >= 0, got {value!r}")
        out[op] = spread
    return out


def v5_fields(data: dict[str, Any], fail: Fail) -> dict[str, Any]:
    """Version 5's ``Profile`` fields from the file's top level; absent keys keep defaults."""
    fields: dict[str, Any] = {}
    if "host" in data:
        fields["host"], fields["host_device_scale"] = read_host(data["host"], fail)
    if (clock := _choice(data, "gpu_clock", GPU_CLOCKS, fail)) is not None:
        fields["gpu_clock"] = clock
    if (tables := _choice(data, "tables_time", TABLES_TIMES, fail)) is not None:
        fields["tables_time"] = tables
    if "commit" in data:
        if not isinstance(data["commit"], str):
            raise fail("commit", f"expected a string, got {data['commit']!r}")
        fields["commit"] = data["commit"]
    ops = data.get("ops")
    if isinstance(ops, dict):
        fields["spreads"] = _spreads(ops, fail)
    return fields
