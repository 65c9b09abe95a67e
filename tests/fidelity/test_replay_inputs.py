"""Which trace a recorded run replayed (``fidelity.replay_inputs.trace_of``): the command's
argument named after the run's trace, else the bundled trace of that name, else another
trace-like argument; never an option's file that merely ends like a trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from fidelity.replay_inputs import ROOT, engine_kind_of_run, trace_of


def test_an_options_json_file_is_not_taken_for_the_trace(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    summary = {"command": f"benchmarks/validate_cpu.py --profile {profile}", "trace": "example"}
    assert trace_of(tmp_path, summary) == ROOT / "traces" / "data" / "example.csv"


def test_the_argument_named_after_the_trace_comes_first(tmp_path: Path) -> None:
    mine = tmp_path / "mine.csv"
    mine.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n")
    other = tmp_path / "other.jsonl"
    other.write_text("")
    summary = {"command": f"python -m engine run {other} {mine}", "trace": "mine"}
    assert trace_of(tmp_path, summary) == mine
    # No argument and no bundled trace by the run's name: another trace-like argument.
    assert trace_of(tmp_path, {"command": f"run {mine}", "trace": "gone"}) == mine


def test_a_run_whose_trace_cannot_be_found_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot find the trace"):
        trace_of(tmp_path, {"command": "run --profile nothing.json", "trace": "gone"})


def test_the_decode_split_of_a_run(tmp_path: Path) -> None:
    from fidelity.replay_inputs import decode_split_of_run

    # A run recorded before the engine had the setting ran "fixed".
    assert decode_split_of_run({}) == decode_split_of_run({"config": {}}) == "fixed"
    assert decode_split_of_run({"config": {"decode_split": "per_sequence"}}) == "per_sequence"
    where = tmp_path / "summary.json"
    with pytest.raises(ValueError, match=r"summary\.json: field 'config\.decode_split'"):
        decode_split_of_run({"config": {"decode_split": "halves"}}, where)


def test_validate_says_which_split_the_engine_ran() -> None:
    import io

    from fidelity.cli.validate import print_context

    result = {
        "trace": "example",
        "num_requests": 3,
        "engine_kind": "servesim-graphs",
        "engine_clock": "wall",
        "decode_split": "per_sequence",
        "profile_timer": "cuda_events",
    }
    out = io.StringIO()
    print_context(result, out)
    assert "engine servesim-graphs, clock wall, decode split per_sequence," in out.getvalue()
    # A result written before the field: the split those runs had.
    del result["decode_split"]
    out = io.StringIO()
    print_context(result, out)
    assert "decode split fixed," in out.getvalue()


def test_a_runs_engine_kind_is_read_from_its_summary() -> None:
    cuda = {"device": "cuda", "enforce_eager": False}
    assert engine_kind_of_run({"config": {"device": "cpu"}}) == "servesim-eager"
    assert engine_kind_of_run({"config": {**cuda, "enforce_eager": True}}) == "servesim-eager"
    assert engine_kind_of_run({"config": cuda}) == "servesim-graphs"
    assert engine_kind_of_run({"config": {**cuda, "mixed_graphs": "off"}}) == "servesim-graphs"
    piecewise = {"config": {**cuda, "mixed_graphs": "piecewise"}}
    assert engine_kind_of_run(piecewise) == "servesim-piecewise"
    assert engine_kind_of_run({**piecewise, "cuda_graphs": False}) == "servesim-eager"
    assert engine_kind_of_run({"config": cuda, "cuda_graphs": False}) == "servesim-eager"
