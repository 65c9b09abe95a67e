"""Every loader on the real traces in ../shared/traces, checked against the facts in that
folder's README and against an independent pandas read."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from traces import LengthTable, TraceFormatError, load_length_table, load_trace
from traces.generators import PoissonArrivals, trace_from_length_table

pytestmark = pytest.mark.shared

AZURE = "azure_llm_2023/AzureLLMInferenceTrace_code.csv"
VIDUR = "vidur_processed/splitwise_code.csv"
MOONCAKE = "mooncake_fast25/synthetic_trace.jsonl"
LENGTH_TABLES = {  # file -> (rows, prompt mean, output mean) from the README
    "vidur_processed/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv": (
        28_257,
        2588.1,
        291.4,
    ),
    "etalon_processed/sharegpt_8k_filtered_stats_llama2_tokenizer.csv": (30_731, 2340.0, 438.7),
    "etalon_processed/bwb_stats_llama2_tokenizer_filtered_v2.csv": (33_768, 1067.2, 1612.8),
}


def test_azure_trace(shared_traces: Path) -> None:
    path = shared_traces / AZURE
    started = time.perf_counter()
    trace = load_trace(path)
    elapsed_s = time.perf_counter() - started
    assert trace.format == "azure"
    assert len(trace) == 8819 and trace.num_skipped == 0
    assert trace.requests[0].arrival_s == 0.0
    assert trace.duration_s == pytest.approx(3435.948056, abs=1e-6)
    assert trace.mean_rate_per_s == pytest.approx(2.567, abs=5e-4)
    first = datetime(2023, 11, 16, 18, 17, 3, 979960, tzinfo=timezone.utc)
    assert trace.arrival_offset_s == pytest.approx(first.timestamp(), abs=1e-6)
    frame = pd.read_csv(path)
    assert sum(r.prompt_tokens for r in trace.requests) == int(frame["ContextTokens"].sum())
    assert sum(r.output_tokens for r in trace.requests) == int(frame["GeneratedTokens"].sum())
    stats = trace.length_stats()
    assert (stats["prompt_median"], stats["prompt_p99"]) == (1469, 7436)
    assert (stats["prompt_min"], stats["prompt_max"]) == (3, 7437)
    assert (stats["output_min"], stats["output_max"]) == (6, 1899)
    assert stats["prompt_mean"] == pytest.approx(2047.8, abs=0.05)
    assert stats["output_mean"] == pytest.approx(27.9, abs=0.05)
    assert elapsed_s < 2.0, f"loading 8,819 rows took {elapsed_s:.2f} s"


def test_vidur_equals_azure_row_for_row(shared_traces: Path) -> None:
    azure = load_trace(shared_traces / AZURE)
    vidur = load_trace(shared_traces / VIDUR)
    assert vidur.format == "vidur" and len(vidur) == len(azure)
    assert load_trace(shared_traces / VIDUR, format="vidur") == vidur
    for a, v in zip(azure.requests, vidur.requests, strict=True):
        assert abs(a.arrival_s - v.arrival_s) <= 1e-6
        assert (a.request_id, a.prompt_tokens, a.output_tokens) == (
            v.request_id,
            v.prompt_tokens,
            v.output_tokens,
        )


def test_mooncake_trace(shared_traces: Path) -> None:
    trace = load_trace(shared_traces / MOONCAKE)
    assert trace.format == "mooncake" and len(trace) == 3993
    assert trace.requests[0].arrival_s == 0.0
    assert trace.duration_s == pytest.approx(1022.025)
    for request in trace.requests:
        assert request.prefix_hash_ids is not None
        assert len(request.prefix_hash_ids) == math.ceil(request.prompt_tokens / 512)
        assert request.hash_block_tokens == 512
    ids = [i for r in trace.requests for i in r.prefix_hash_ids or ()]
    assert (len(ids), len(set(ids))) == (121_877, 43_924)
    stats = trace.length_stats()
    assert stats["hash_block_reuse"] == pytest.approx(0.640, abs=5e-4)
    assert stats["prompt_mean"] == pytest.approx(15325.5, abs=0.05)
    assert stats["output_mean"] == pytest.approx(149.1, abs=0.05)
    assert len({r.arrival_s for r in trace.requests}) == 3982


@pytest.mark.parametrize("name", sorted(LENGTH_TABLES))
def test_length_tables_with_poisson_arrivals(shared_traces: Path, name: str) -> None:
    rows, prompt_mean, output_mean = LENGTH_TABLES[name]
    table = load_length_table(shared_traces / name)
    assert isinstance(table, LengthTable) and len(table) == rows
    assert sum(table.prompt_tokens) / rows == pytest.approx(prompt_mean, abs=0.05)
    assert sum(table.output_tokens) / rows == pytest.approx(output_mean, abs=0.05)
    trace = trace_from_length_table(table, PoissonArrivals(10.0), seed=7)
    assert len(trace) == rows and trace.requests[0].arrival_s == 0.0
    assert [r.prompt_tokens for r in trace.requests] == list(table.prompt_tokens)
    assert [r.output_tokens for r in trace.requests] == list(table.output_tokens)
    assert trace.mean_rate_per_s == pytest.approx(10.0, rel=0.05)
    with pytest.raises(TraceFormatError) as refused:
        load_trace(shared_traces / name)
    assert "trace generate --lengths table --length-table" in str(refused.value.problems[0])


def test_length_table_from_a_trace_file(shared_traces: Path) -> None:
    table = load_length_table(shared_traces / AZURE)
    assert len(table) == 8819 and table.prompt_tokens[:2] == (4808, 3180)
