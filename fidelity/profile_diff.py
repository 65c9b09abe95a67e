"""Where two calibrations of one engine differ (``profile_differences``): their raw op tables at
the grid points both measured (against the points' own spread, where stored), their whole
steps at matching shapes (decode-only apart from steps with prefill, the host's part apart), and
a verdict naming the cause. ``sim calibrate --repeat N`` and the recorded-run benchmark print it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.costmodel.profile import Profile, StepTiming, Table1D, Table2D

AGREE_PCT = 5.0
"""Two calibrations agree when their tables (median over shared points) and their whole steps
(median over matching shapes) differ by at most this (issue 30's target for two profiles)."""
BEYOND_SPREAD_SHARE = 0.5
"""The tables differ by more than their spread when more than this share of the shared points
differ by more than the two points' spreads together."""
VERDICTS = ("agree", "host", "device", "tables", "noisy", "fit")


def _shared_points(
    a: Table1D | Table2D, b: Table1D | Table2D
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Index pairs (in ``a``, in ``b``) of every grid point the two tables both measured."""
    if isinstance(a, Table1D) and isinstance(b, Table1D):
        where = {x: i for i, x in enumerate(b.xs)}
        return [((i,), (where[x],)) for i, x in enumerate(a.xs) if x in where]
    if isinstance(a, Table2D) and isinstance(b, Table2D):
        rows = {x: i for i, x in enumerate(b.xs)}
        cols = {y: j for j, y in enumerate(b.ys)}
        return [
            ((i, j), (rows[x], cols[y]))
            for i, x in enumerate(a.xs)
            if x in rows
            for j, y in enumerate(a.ys)
            if y in cols
        ]
    return []


def _at(values: Any, idx: tuple[int, ...]) -> float:
    for i in idx:
        values = values[i]
    return float(values)


def _table_difference(a: Profile, b: Profile, op: str) -> dict[str, Any] | None:
    """One op table's shared points: median |b/a - 1| and median signed (b/a - 1), in percent;
    where both profiles store the points' spreads, the share of points whose difference exceeds
    the two spreads together."""
    points = [
        (ia, ib)
        for ia, ib in _shared_points(a.ops[op], b.ops[op])
        if _at(a.ops[op].times_s, ia) > 0
    ]
    if not points:
        return None
    ta = np.array([_at(a.ops[op].times_s, ia) for ia, _ in points])
    tb = np.array([_at(b.ops[op].times_s, ib) for _, ib in points])
    rel = 100 * (tb / ta - 1)
    out: dict[str, Any] = {
        "n": len(points),
        "median_abs_pct": float(np.median(np.abs(rel))),
        "median_pct": float(np.median(rel)),
        "rel_pct": rel.tolist(),
    }
    if op in a.spreads and op in b.spreads:
        sa = np.array([_at(a.spreads[op], ia) for ia, _ in points])
        sb = np.array([_at(b.spreads[op], ib) for _, ib in points])
        beyond = np.abs(tb - ta) > sa + sb
        out["beyond_spread"] = beyond.tolist()
        out["beyond_spread_share"] = float(beyond.mean())
        out["median_spread_pct"] = float(np.median(100 * (sa + sb) / ta))
    return out


def _step_key(step: StepTiming) -> tuple[Any, ...]:
    contexts = step.decode_context_tokens
    decodes = (
        contexts if contexts is not None else (step.num_decode_seqs, step.sum_decode_context_tokens)
    )
    return (step.prefill_chunks, decodes)


def _matching_steps(
    a: Sequence[StepTiming], b: Sequence[StepTiming]
) -> list[tuple[StepTiming, StepTiming]]:
    """Each step of ``a`` with a step of ``b`` of the same shape, in order within a shape."""
    pending: dict[tuple[Any, ...], list[StepTiming]] = defaultdict(list)
    for step in b:
        pending[_step_key(step)].append(step)
    pairs = []
    for step in a:
        same = pending.get(_step_key(step))
        if same:
            pairs.append((step, same.pop(0)))
    return pairs


def _relative(first: Sequence[float], second: Sequence[float]) -> dict[str, Any]:
    """n, median signed and median |second/first - 1| in percent (pairs with first > 0)."""
    x, y = np.array(first, dtype=float), np.array(second, dtype=float)
    keep = x > 0
    if not keep.any():
        return {"n": 0, "median_pct": None, "median_abs_pct": None}
    rel = 100 * (y[keep] / x[keep] - 1)
    return {
        "n": int(keep.sum()),
        "median_pct": float(np.median(rel)),
        "median_abs_pct": float(np.median(np.abs(rel))),
    }


def _step_difference(a: Profile, b: Profile) -> dict[str, Any]:
    """The whole steps' measured times at matching shapes: all, decode-only, with prefill;
    the host's part and the rest where both store ``host_s``; their input preparation where
    both store ``prepare_s`` (how much slower the second host ran: ``fidelity.host_speed``)."""
    pairs = _matching_steps(a.steps, b.steps)
    out: dict[str, Any] = {"num_a": len(a.steps), "num_b": len(b.steps)}
    groups = {
        "all": pairs,
        "decode_only": [p for p in pairs if not p[0].prefill_chunks],
        "with_prefill": [p for p in pairs if p[0].prefill_chunks],
    }
    for name, group in groups.items():
        out[name] = _relative([p.measured_s for p, _ in group], [q.measured_s for _, q in group])
    timed = [(p, q) for p, q in pairs if p.host_s is not None and q.host_s is not None]
    if timed:
        out["host"] = _relative(
            [p.host_s or 0.0 for p, _ in timed], [q.host_s or 0.0 for _, q in timed]
        )
        out["rest"] = _relative(
            [p.measured_s - (p.host_s or 0.0) for p, _ in timed],
            [q.measured_s - (q.host_s or 0.0) for _, q in timed],
        )
    prepared = [(p, q) for p, q in pairs if p.prepare_s and q.prepare_s]
    if prepared:  # the two hosts' speed, from the same steps' input preparation
        out["prepare"] = _relative(
            [p.prepare_s or 0.0 for p, _ in prepared], [q.prepare_s or 0.0 for _, q in prepared]
        )
    return out


def _pooled(tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every shared point of every table together; drops the per-point lists from ``tables``."""
    rel = np.concatenate([np.array(t.pop("rel_pct")) for t in tables.values()] or [np.zeros(0)])
    out: dict[str, Any] = {
        "n": int(rel.size),
        "median_abs_pct": float(np.median(np.abs(rel))) if rel.size else None,
        "median_pct": float(np.median(rel)) if rel.size else None,
    }
    flags = [flag for t in tables.values() for flag in t.pop("beyond_spread", [])]
    if flags:
        out["num_with_spread"] = len(flags)
        out["beyond_spread_share"] = float(np.mean(flags))
    return out


def profile_differences(a: Profile, b: Profile) -> dict[str, Any]:
    """Where ``b`` differs from ``a``: per op table (``tables``) and all tables pooled
    (``tables_all``), the whole steps (``steps``), and a ``verdict`` (VERDICTS) with its ``text``.
    Relative differences are ``b / a - 1`` in percent."""
    tables: dict[str, dict[str, Any]] = {}
    for op in sorted(set(a.ops) & set(b.ops)):
        difference = _table_difference(a, b, op)
        if difference is not None:
            tables[op] = difference
    pooled = _pooled(tables)
    steps = _step_difference(a, b)
    verdict, text = _verdict(pooled, steps, _launches_in_rest(a))
    return {
        "tables": tables,
        "tables_all": pooled,
        "steps": steps,
        "verdict": verdict,
        "text": text,
    }


def _launches_in_rest(profile: Profile) -> bool:
    """Whether a step's part outside its measured host time holds host work too: an eager
    engine on a GPU launches its forward's kernels one by one, inside that part."""
    engine = profile.engine or {}
    return engine.get("kind") == "servesim-eager" and profile.timer == "cuda_events"


def _verdict(
    tables: dict[str, Any], steps: dict[str, Any], launches_in_rest: bool = False
) -> tuple[str, str]:
    """The cause, in VERDICTS, and a sentence saying it with the figures behind it.
    ``launches_in_rest``: the steps' part outside their host time is the eager forward's, its
    launches with its kernels (``_launches_in_rest``)."""
    table_pct = tables["median_abs_pct"]
    step_pct = steps["all"]["median_abs_pct"]
    share = tables.get("beyond_spread_share")
    tables_text = (
        f"the op tables differ by {table_pct:.1f}% (median over {tables['n']} shared points"
        + (
            f", {100 * share:.0f}% of them by more than their own spread)"
            if share is not None
            else ")"
        )
        if table_pct is not None
        else "the profiles share no op table points"
    )
    steps_text = (
        f"the whole steps differ by {steps['all']['median_pct']:+.1f}% (median over "
        f"{steps['all']['n']} matching shapes; decode-only {_pct(steps['decode_only'])}, "
        f"with prefill {_pct(steps['with_prefill'])})"
        if step_pct is not None
        else "no whole steps of the same shape to compare"
    )
    if table_pct is not None and table_pct > AGREE_PCT:
        if share is None or share > BEYOND_SPREAD_SHARE:
            spread = "" if share is None else " by more than their spread"
            shifted = abs(tables["median_pct"]) > AGREE_PCT
            shift = f"shifted {tables['median_pct']:+.1f}% one way"
            if not shifted:
                cause = "scattered both ways: their points are noisy"
            elif step_pct is not None and step_pct <= AGREE_PCT:
                # The whole steps ran on the same device and agree: not the device's speed.
                # On the H200 (2026-11-28) one calibration's tables timed the host's launches.
                cause = (
                    f"{shift} while the whole steps agree: one profile's tables timed more than "
                    "the kernels (on a GPU, the host's launches: its engine's timer_late)"
                )
            else:
                cause = f"{shift}: the device ran at another speed"
            return "tables", (
                f"{tables_text}; {steps_text}: the tables themselves differ{spread}, "
                f"{cause}; calibrate again and compare"
            )
        return "noisy", (
            f"{tables_text}; {steps_text}: the tables differ but within their points' own "
            "spread, too noisy to tell; calibrate with more rounds"
        )
    if step_pct is None or step_pct <= AGREE_PCT:
        return "agree", f"{tables_text}; {steps_text}: the two calibrations agree"
    host, rest = steps.get("host"), steps.get("rest")
    if (
        host
        and rest
        and host["n"]
        and rest["n"]
        and abs(rest["median_pct"]) > abs(host["median_pct"])
    ):
        if launches_in_rest and table_pct is not None and table_pct <= AGREE_PCT:
            # The tables time the kernels alone and agree: the launches moved, not the GPU
            # (the eager engine on the H200, 2026-11-28: tables 0.9% apart, steps +10.8%).
            return "host", (
                f"{tables_text}; {steps_text}; their host part {_pct(host)}, the rest "
                f"{_pct(rest)}: the rest is the eager forward, its kernels and their launches, "
                "and the kernels alone (the tables) agree: the host ran its launches at another "
                "speed; calibrate with the machine otherwise idle"
            )
        return "device", (
            f"{tables_text}; {steps_text}; their host part {_pct(host)}, the rest {_pct(rest)}: "
            "the device ran at another speed while the whole steps were timed"
        )
    host_text = f"; their host part {_pct(host)}, the rest {_pct(rest)}" if host and rest else ""
    return "host", (
        f"{tables_text}; {steps_text}{host_text}: the host ran at another speed (its share of "
        "a step is largest in decode-only steps); calibrate with the machine otherwise idle"
    )


def _pct(stats: dict[str, Any] | None) -> str:
    if not stats or stats.get("median_pct") is None:
        return "-"
    return f"{stats['median_pct']:+.1f}% (n={stats['n']})"


def with_predictions(
    differences: dict[str, Any],
    predictions_pct: float,
    fitted: tuple[dict[str, float], ...],
    spreads_pct: tuple[float | None, ...] = (),
) -> dict[str, Any]:
    """``differences`` once the two models' predictions of the same steps are known: where
    the data agree but the predictions differ by more than AGREE_PCT (median, ``predictions_pct``),
    the verdict is ``fit``: not the machine but the models moved. That happens when a model
    fits its own steps loosely (``spreads_pct``, each one's median |residual|), so that small
    differences in the data move its coefficients (``fitted``, each model's) and its
    predictions elsewhere."""
    if differences["verdict"] != "agree" or predictions_pct <= AGREE_PCT:
        return differences
    moved = ", ".join(
        f"{name} {a:.3g} against {b:.3g}"
        for name, a in fitted[0].items()
        if (b := fitted[1].get(name)) is not None and abs(b - a) > 0.05 * max(abs(a), abs(b))
    )
    spread = " and ".join(f"{x:.1f}%" for x in spreads_pct if x is not None)
    text = (
        f"{differences['text'].rsplit(':', 1)[0]}: the data agree, but the fitted models "
        f"predict the same steps {predictions_pct:.1f}% apart (median)"
        + (f", each scattering {spread} around its own steps" if spread else "")
        + ": the model's fit moves with small differences in the data, not the machine"
        + (f" ({moved})" if moved else "")
    )
    return {**differences, "verdict": "fit", "text": text}


def describe(differences: dict[str, Any]) -> list[str]:
    """Printable lines: one per op table, then the whole steps, then the verdict."""
    lines = []
    for op, t in differences["tables"].items():
        spread = (
            f", {100 * t['beyond_spread_share']:.0f}% of points beyond their spread "
            f"({t['median_spread_pct']:.1f}%)"
            if "beyond_spread_share" in t
            else ""
        )
        lines.append(
            f"  table {op:18s} median |difference| {t['median_abs_pct']:5.1f}%, signed "
            f"{t['median_pct']:+5.1f}% (n={t['n']}){spread}"
        )
    steps = differences["steps"]
    for name in ("all", "decode_only", "with_prefill", "host", "rest", "prepare"):
        if name in steps and steps[name]["n"]:
            s = steps[name]
            lines.append(
                f"  steps {name:18s} median difference {s['median_pct']:+6.1f}%, |difference| "
                f"{s['median_abs_pct']:5.1f}% (n={s['n']})"
            )
    lines.append(f"  verdict ({differences['verdict']}): {differences['text']}")
    return lines
