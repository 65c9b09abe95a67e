"""The schema's validation (errors name the field and value), the `Trace` helpers, and exact
date-time parsing."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from traces import LengthTable, Trace, TraceProblem, TraceRequest
from traces.timestamps import parse_timestamp_ns


def _request(request_id: str = "r", arrival_s: float = 0.0, **fields: Any) -> TraceRequest:
    values: dict[str, Any] = {"prompt_tokens": 10, "output_tokens": 5} | fields
    return TraceRequest(request_id, arrival_s, **values)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_tokens": 0}, "prompt_tokens must be an int >= 1, got 0"),
        ({"output_tokens": -2}, "output_tokens must be an int >= 1, got -2"),
        ({"output_tokens": 2.0}, "output_tokens must be an int >= 1, got 2.0"),
        ({"num_samples": 0}, "num_samples must be an int >= 1, got 0"),
        ({"hash_block_tokens": 0}, "hash_block_tokens must be an int >= 1"),
        ({"prompt_token_ids": (1, 2)}, "prompt_token_ids has 2 ids but prompt_tokens is 10"),
        ({"prompt_token_ids": [1] * 10}, "prompt_token_ids must be a tuple"),
        ({"prefix_hash_ids": (1, 2)}, "prefix_hash_ids has 2 ids but a 10-token prompt"),
        ({"prefix_hash_ids": ("a",)}, "prefix_hash_ids must hold ints, got 'a'"),
    ],
)
def test_request_validation_names_field_and_value(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _request(**fields)


@pytest.mark.parametrize("arrival_s", [-1.0, float("nan"), float("inf")])
def test_request_arrival_must_be_finite_and_not_negative(arrival_s: float) -> None:
    with pytest.raises(ValueError, match="arrival_s"):
        _request(arrival_s=arrival_s)


def test_request_id_must_be_non_empty() -> None:
    with pytest.raises(ValueError, match="request_id"):
        _request("")


def test_trace_validation() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        Trace("t", ())
    with pytest.raises(ValueError, match="non-decreasing"):
        Trace("t", (_request("a", 1.0), _request("b", 0.5)))
    with pytest.raises(ValueError, match="duplicate"):
        Trace("t", (_request("a"), _request("a")))
    with pytest.raises(ValueError, match="num_skipped"):
        Trace("t", (_request(),), num_skipped=-1)
    listed = Trace("t", [_request()])  # type: ignore[arg-type]
    assert isinstance(listed.requests, tuple)


def test_trace_helpers() -> None:
    requests = (
        _request("a", 0.0, prompt_tokens=10, output_tokens=1, prefix_hash_ids=(1,)),
        _request("b", 1.0, prompt_tokens=20, output_tokens=3, prefix_hash_ids=(1,)),
        _request("c", 4.0, prompt_tokens=30, output_tokens=5, num_samples=3),
    )
    problems = (TraceProblem("f.csv", 3, "x", "not a number: 'a'"),)
    trace = Trace("t", requests, num_skipped=1, problems=problems)
    assert len(trace) == 3 and trace.duration_s == 4.0 and trace.mean_rate_per_s == 0.75
    stats = trace.length_stats()
    assert stats["prompt_mean"] == 20 and stats["prompt_median"] == 20
    assert stats["prompt_p99"] == pytest.approx(29.8)
    assert (stats["output_min"], stats["output_max"]) == (1, 5)
    assert stats["num_samples_mean"] == pytest.approx(5 / 3)
    assert stats["hash_block_reuse"] == 0.5
    assert trace.describe_skipped() == "skipped 1 row(s) of t: 1 x x: not a number"
    single = Trace("one", (_request(),))
    assert single.mean_rate_per_s == 0.0 and "hash_block_reuse" not in single.length_stats()
    assert single.describe_skipped() == ""


def test_length_table_validation() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        LengthTable("t", (), ())
    with pytest.raises(ValueError, match="output_tokens has 1 entries"):
        LengthTable("t", (1, 2), (1,))
    with pytest.raises(ValueError, match="prompt_tokens must hold ints >= 1, got 0"):
        LengthTable("t", (0,), (1,))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-11-16 18:17:03.9799600", datetime(2023, 11, 16, 18, 17, 3, 979960)),
        ("2024-05-10 00:00:00.009930+00:00", datetime(2024, 5, 10, 0, 0, 0, 9930)),
        ("2024-05-10 00:00:01+00:00", datetime(2024, 5, 10, 0, 0, 1)),
        ("2024-05-10T02:00:01+02:00", datetime(2024, 5, 10, 0, 0, 1)),
        ("2024-05-10 00:00:01Z", datetime(2024, 5, 10, 0, 0, 1)),
    ],
)
def test_timestamps_parse_exactly(text: str, expected: datetime) -> None:
    unix_s = expected.replace(tzinfo=timezone.utc).timestamp()
    assert parse_timestamp_ns(text) == round(unix_s * 1e6) * 1000


def test_timestamps_keep_nanoseconds_and_reject_garbage() -> None:
    cache: dict[str, int] = {}
    base = parse_timestamp_ns("2023-11-16 18:17:03", cache)
    assert parse_timestamp_ns("2023-11-16 18:17:03.123456789", cache) - base == 123_456_789
    assert list(cache) == ["2023-11-16"]
    for bad in ("", "yesterday", "2023-13-01 00:00:00", "2023-11-16 25:00:00", "1700000000"):
        with pytest.raises(ValueError):
            parse_timestamp_ns(bad)
