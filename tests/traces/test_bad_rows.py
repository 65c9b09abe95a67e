"""Malformed input in every format: each problem names file, line and field; `on_error="skip"`
counts what it leaves out; structural problems (missing column, empty file) always fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces.conftest import FORMAT_CASES, Cells, FormatCase
from traces import TraceFormatError, TraceProblem, load_length_table, load_trace
from traces.problems import MAX_LISTED_PROBLEMS


def _rows_with(case: FormatCase, bad: Cells) -> list[Cells]:
    """Three good rows with `bad` third, i.e. on data row index 2."""
    return [case.good(0.0), case.good(1.0), bad, case.good(3.0)]


def _bad_cells(case: FormatCase, kind: str) -> tuple[Cells, str]:
    """A bad third row of the given kind and the field that should be blamed."""
    time = case.time(2.0)
    if kind == "non-numeric":
        return (time, case.text("abc"), "20"), case.prompt_field
    if kind == "zero-prompt":
        return (time, "0", "20"), case.prompt_field
    if kind == "negative-output":
        return (time, "100", "-3"), case.output_field
    if kind == "fractional":
        return (time, "12.5", "20"), case.prompt_field
    if kind == "nan-time":
        return (case.text("nan") if case.name == "azure" else "NaN", "100", "20"), case.time_field
    if kind == "nan-tokens":
        return (time, "NaN", "20"), case.prompt_field
    if kind == "backwards":
        return (case.time(0.5), "100", "20"), case.time_field
    raise AssertionError(kind)


BAD_KINDS = (
    "non-numeric",
    "zero-prompt",
    "negative-output",
    "fractional",
    "nan-time",
    "nan-tokens",
    "backwards",
)


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_row_names_file_line_and_field(case: FormatCase, kind: str, tmp_path: Path) -> None:
    bad, field = _bad_cells(case, kind)
    path = case.write(tmp_path / f"trace.{case.name}", _rows_with(case, bad))
    line = case.first_data_line + 2
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path, format=case.name)
    problems = caught.value.problems
    assert [(p.path, p.line, p.field) for p in problems] == [(str(path), line, field)]
    assert f"{path}:{line}: {field}:" in str(caught.value)


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_skip_leaves_out_and_counts_bad_rows(case: FormatCase, kind: str, tmp_path: Path) -> None:
    bad, field = _bad_cells(case, kind)
    path = case.write(tmp_path / f"trace.{case.name}", _rows_with(case, bad))
    trace = load_trace(path, format=case.name, on_error="skip")
    assert len(trace) == 3
    assert trace.num_skipped == 1
    assert [(p.line, p.field) for p in trace.problems] == [(case.first_data_line + 2, field)]
    # Ids are data-row indices, so the rows after a skipped one keep theirs.
    assert [r.request_id for r in trace.requests] == ["0", "1", "3"]
    assert trace.requests[-1].arrival_s == pytest.approx(3.0)
    assert "skipped 1 row(s)" in trace.describe_skipped()


CSV_FORMATS = sorted(name for name, case in FORMAT_CASES.items() if case.header is not None)


@pytest.mark.parametrize("fmt", CSV_FORMATS)
def test_missing_required_column_fails_even_when_skipping(fmt: str, tmp_path: Path) -> None:
    case = FORMAT_CASES[fmt]
    assert case.header is not None
    names = case.header.split(",")
    header = ",".join(name for name in names if name != case.output_field)
    path = tmp_path / "trace.csv"
    path.write_text(header + "\n" + ",".join(["1"] * (len(names) - 1)) + "\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path, format=fmt, on_error="skip")
    assert [(p.line, p.field) for p in caught.value.problems] == [(1, case.output_field)]
    assert "missing required column" in str(caught.value)


@pytest.mark.parametrize("fmt", CSV_FORMATS)
def test_short_row_blames_the_first_missing_column(fmt: str, tmp_path: Path) -> None:
    case = FORMAT_CASES[fmt]
    assert case.header is not None
    path = case.write(tmp_path / "trace.csv", [case.good(0.0), case.good(1.0)])
    short = case.row(case.good(2.0)).rsplit(",", 1)[0]
    text = path.read_text()
    path.write_text(text + ("" if text.endswith("\n") else "\n") + short + "\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path, format=fmt)
    assert [(p.line, p.field) for p in caught.value.problems] == [(4, case.header.split(",")[-1])]


def test_mooncake_missing_key_is_a_row_problem(tmp_path: Path) -> None:
    case = FORMAT_CASES["mooncake"]
    path = case.write(tmp_path / "trace.jsonl", [case.good(0.0)])
    path.write_text(path.read_text() + '{"timestamp": 2000, "input_length": 100}\n')
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert [(p.line, p.field) for p in caught.value.problems] == [(2, "output_length")]


def test_all_problems_listed_first_20_then_a_count(case: FormatCase, tmp_path: Path) -> None:
    rows = [case.good(0.0)] + [(case.time(float(i)), case.text("x"), "20") for i in range(1, 31)]
    path = case.write(tmp_path / "trace", rows)
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path, format=case.name)
    error = caught.value
    assert len(error.problems) == 30
    assert [p.line for p in error.problems] == [case.first_data_line + i for i in range(1, 31)]
    listed = [line for line in str(error).splitlines() if line.startswith(f"  {path}:")]
    assert len(listed) == MAX_LISTED_PROBLEMS
    assert "... and 10 more problem(s)" in str(error)
    skipped = load_trace(path, format=case.name, on_error="skip")
    assert (len(skipped), skipped.num_skipped, len(skipped.problems)) == (1, 30, 30)


def test_header_only_and_empty_files_fail_clearly(case: FormatCase, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(TraceFormatError, match=r"empty|no data rows"):
        load_trace(empty, format=case.name)
    with pytest.raises(TraceFormatError, match="empty"):
        load_trace(empty)
    if case.header is not None:
        header_only = tmp_path / "header_only.csv"
        header_only.write_text(case.header + "\n")
        for fmt in (case.name, "auto"):
            with pytest.raises(TraceFormatError, match="no data rows"):
                load_trace(header_only, format=fmt)


def test_all_rows_bad_with_skip_is_still_an_error(case: FormatCase, tmp_path: Path) -> None:
    path = case.write(tmp_path / "trace", [(case.time(0.0), "0", "20")] * 2)
    with pytest.raises(TraceFormatError, match="no usable rows") as caught:
        load_trace(path, format=case.name, on_error="skip")
    assert len(caught.value.problems) == 2


def test_extra_fields_are_reported(tmp_path: Path) -> None:
    case = FORMAT_CASES["vidur"]
    path = case.write(tmp_path / "t.csv", [case.good(0.0)])
    path.write_text(path.read_text() + "1.0,100,20,99\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert [(p.line, p.field) for p in caught.value.problems] == [(3, "row")]


def test_servesim_specific_problems(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "request_id,arrival_s,prompt_tokens,output_tokens,num_samples,prefix_hash_ids,"
        "prompt_token_ids\n"
        "a,0.0,3,5,1,,1 2 3\n"
        "a,0.5,3,5,1,,\n"  # duplicate id
        "b,1.0,3,5,0,,\n"  # zero samples
        "c,1.5,3,5,1,1 x,\n"  # bad hash id list
        "d,2.0,3,5,1,,1 2\n"  # token ids do not match prompt_tokens
        "e,2.5,3,5,1,1;2,\n"  # two hash ids for a one-block prompt
    )
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    found = [(p.line, p.field) for p in caught.value.problems]
    assert found == [
        (3, "request_id"),
        (4, "num_samples"),
        (5, "prefix_hash_ids"),
        (6, "prompt_token_ids"),
        (7, "prefix_hash_ids"),
    ]


def test_mooncake_specific_problems(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        "not json\n"
        "[1, 2]\n"
        '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": ["a"]}\n'
        '{"timestamp": 6, "input_length": true, "output_length": 2}\n'
    )
    trace = load_trace(path, on_error="skip")
    assert len(trace) == 1
    assert [(p.line, p.field) for p in trace.problems] == [
        (2, "json"),
        (3, "json"),
        (4, "hash_ids"),
        (5, "input_length"),
    ]


def test_problem_str_is_path_line_field_message() -> None:
    assert str(TraceProblem("a.csv", 7, "arrival_s", "bad")) == "a.csv:7: arrival_s: bad"


def test_missing_file_directory_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match="directory"):
        load_trace(tmp_path)
    path = FORMAT_CASES["vidur"].write(tmp_path / "t.csv", [("0.0", "1", "1")])
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(path, format="parquet")
    with pytest.raises(ValueError, match="on_error"):
        load_trace(path, on_error="ignore")
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("when,how_many\n1,2\n")
    with pytest.raises(TraceFormatError, match="cannot detect") as caught:
        load_trace(unknown)
    assert caught.value.problems[0].line == 1
    # Forcing the wrong format names the missing columns.
    with pytest.raises(TraceFormatError, match="TIMESTAMP"):
        load_trace(path, format="azure")


def test_length_table_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text(
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
        "10,5,15,2.0\n"
        "x,5,15,2.0\n"
        "10,0,10,inf\n"
        "7,3\n"
    )
    with pytest.raises(TraceFormatError) as caught:
        load_length_table(path)
    assert [(p.line, p.field) for p in caught.value.problems] == [
        (3, "num_prefill_tokens"),
        (4, "num_decode_tokens"),
        (5, "num_total_tokens"),
    ]
    table = load_length_table(path, on_error="skip")
    assert (table.prompt_tokens, table.output_tokens, table.num_skipped) == ((10,), (5,), 3)


def test_an_unknown_header_names_each_formats_columns_and_the_missing_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "near.csv"
    path.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n0,5,5\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    text = str(caught.value)
    assert "--format" in text and "format=" in text and "pass format=" not in text
    (problem,) = caught.value.problems
    assert (
        "servesim needs arrival_s, prompt_tokens, output_tokens (missing prompt_tokens, "
        "output_tokens)" in problem.message
    )
    assert "vidur needs arrived_at, num_prefill_tokens, num_decode_tokens" in problem.message
    assert "azure needs TIMESTAMP, ContextTokens, GeneratedTokens" in problem.message
    assert "burstgpt needs Timestamp, Request tokens, Response tokens" in problem.message
    assert "mooncake is JSON Lines with the keys timestamp, input_length" in problem.message
    record = tmp_path / "near.jsonl"
    record.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(TraceFormatError, match=r"missing output_length"):
        load_trace(record)


@pytest.mark.parametrize(
    ("text", "message"),
    [("high", "not a number"), ("1.5", "expected an integer"), ("nan", "finite")],
)
def test_a_bad_priority_names_file_line_and_field(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(f"arrival_s,prompt_tokens,output_tokens,priority\n0,5,5,-2\n1,5,5,{text}\n")
    with pytest.raises(TraceFormatError) as caught:
        load_trace(path)
    assert [(p.line, p.field) for p in caught.value.problems] == [(3, "priority")]
    assert message in str(caught.value)


def test_priorities_may_be_negative_and_default_to_zero(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,priority\n0,5,5,-2\n1,5,5,\n")
    assert [r.priority for r in load_trace(path).requests] == [-2, 0]


def test_a_column_the_format_lacks_is_named_with_its_likely_spelling(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,priorty,comment\n0,5,5,1,x\n")
    trace = load_trace(path)
    assert trace.notes == (
        "columns not read (the servesim format has no such column): 'priorty' (did you mean "
        "'priority'?), 'comment'",
    )
    assert trace.requests[0].priority == 0
