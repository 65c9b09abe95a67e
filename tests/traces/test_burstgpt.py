"""BurstGPT loader on a small handmade file (the real trace is not available): failed requests
(0 response tokens) are skipped and counted, treated as errors, or kept, as the caller chooses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from traces import TraceFormatError, load_trace
from traces.loaders import load_burstgpt

ROWS = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,294,711,Conversation log
118,ChatGPT,1360,0,1360,API log
140,GPT-4,121,35,156,API log
"""


@pytest.fixture
def burstgpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "BurstGPT_sample.csv"
    path.write_text(ROWS)
    return path


def test_failures_skipped_and_counted_by_default(burstgpt_file: Path) -> None:
    trace = load_trace(burstgpt_file)
    assert trace.format == "burstgpt"
    assert [r.request_id for r in trace.requests] == ["0", "2", "4"]
    assert [r.arrival_s for r in trace.requests] == [0.0, 113.0, 135.0]
    assert trace.arrival_offset_s == 5.0
    assert [(r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (472, 18),
        (417, 294),
        (121, 35),
    ]
    assert trace.num_skipped == 2
    assert [(p.line, p.field) for p in trace.problems] == [
        (3, "Response tokens"),
        (5, "Response tokens"),
    ]
    assert "2 x Response tokens: failed request" in trace.describe_skipped()


def test_failures_as_errors(burstgpt_file: Path) -> None:
    with pytest.raises(TraceFormatError) as caught:
        load_trace(burstgpt_file, burstgpt_failures="error")
    assert [p.line for p in caught.value.problems] == [3, 5]
    skipped = load_trace(burstgpt_file, burstgpt_failures="error", on_error="skip")
    assert (len(skipped), skipped.num_skipped) == (3, 2)


def test_failures_kept_with_one_output_token_and_a_note(burstgpt_file: Path) -> None:
    trace = load_burstgpt(burstgpt_file, burstgpt_failures="keep")
    assert len(trace) == 5 and trace.num_skipped == 0
    assert [r.output_tokens for r in trace.requests][1::2] == [1, 1]
    assert trace.notes == (
        "kept 2 failed request(s) (0 response tokens) as output_tokens=1"
        " (burstgpt_failures='keep')",
    )


def test_model_filter_is_noted(burstgpt_file: Path) -> None:
    trace = load_trace(burstgpt_file, models={"GPT-4"})
    assert [r.request_id for r in trace.requests] == ["2", "4"]
    assert trace.notes == ("left out 3 row(s) whose Model is not one of ['GPT-4']",)


def test_bad_failure_option(burstgpt_file: Path) -> None:
    with pytest.raises(ValueError, match="burstgpt_failures"):
        load_trace(burstgpt_file, burstgpt_failures="drop")
