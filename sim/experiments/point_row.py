"""What a sweep row adds to a run's summary: the GPUs the point holds (``num_gpus``), its SLO
attainment (``slo_attainment``) and how to judge it (``point_judgement``: overloaded or not,
the attainment's 95% interval, and why requests were rejected where some were)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from core.request import Request, RequestStatus
from records.attainment import attainment_interval, good_in_arrival_order


def num_gpus(config: Any) -> int:
    """GPUs a deployment holds: TP times its replicas (both pools for disagg)."""
    replicas = (
        config.num_prefill + config.num_decode
        if config.scheduler.policy == "disagg"
        else (config.num_replicas)
    )
    return int(config.tp * replicas)


def slo_attainment(summary: Mapping[str, Any]) -> float | None:
    """Share of all requests that finished within both SLOs (request_goodput × duration over
    num_requests; the count is rounded back to an integer)."""
    goodput, duration = summary.get("request_goodput"), summary.get("duration_s")
    total = summary.get("num_requests") or 0
    if goodput is None or duration is None or not total:
        return None
    return round(float(goodput) * float(duration)) / float(total)


def point_judgement(result: Any) -> dict[str, Any]:
    """What a sweep row adds to the run's summary to judge it: whether the run was overloaded
    (``records.overload``), with SLOs the 95% interval of its SLO attainment by batch means
    (``records.attainment``), and where requests were rejected the most common reason
    (``reject_reason``: a capacity search stops on it when every request is rejected)."""
    judged: dict[str, Any] = {"overloaded": result.overload is not None}
    config = result.config
    if config.slo_ttft_s is not None or config.slo_tpot_s is not None:
        good = good_in_arrival_order(result.requests, config.slo_ttft_s, config.slo_tpot_s)
        interval = attainment_interval(good)
        if interval is not None:
            judged["slo_attainment_low"], judged["slo_attainment_high"] = interval
    reason = common_reject_reason(result.requests)
    if reason is not None:
        judged["reject_reason"] = reason
    return judged


def common_reject_reason(requests: Sequence[Request]) -> str | None:
    """The most common reason among the rejected requests (reasons that differ only in their
    numbers, such as each request's length, count as one), or None where none was rejected."""
    reasons = [
        r.reject_reason or "no reason recorded"
        for r in requests
        if r.status is RequestStatus.REJECTED
    ]
    if not reasons:
        return None
    kinds = [_reason_kind(reason) for reason in reasons]
    commonest = Counter(kinds).most_common(1)[0][0]
    return reasons[kinds.index(commonest)]


def _reason_kind(reason: str) -> str:
    """A rejection reason without the words that hold numbers."""
    return " ".join(word for word in reason.split() if not any(ch.isdigit() for ch in word))
