"""``step_shapes.jsonl``: round trip, and bad lines named by file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from records.step_shapes import StepShapeRecord, load_step_shapes, write_step_shapes


def _record(idx: int) -> StepShapeRecord:
    return StepShapeRecord(
        step_idx=idx,
        start_s=0.5 * idx,
        duration_s=0.25,
        prepare_s=0.01,
        update_s=0.001,
        request_ids=("a", "b"),
        prefill_chunks=((32, 16),),
        decode_context_tokens=(40,),
        num_copy_blocks=1,
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "step_shapes.jsonl"
    records = [_record(0), _record(1)]
    write_step_shapes(path, records)
    assert load_step_shapes(path) == records
    assert records[0].busy_s == pytest.approx(0.251)
    assert records[0].kind == "prefill-heavy"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"step_idx": 0}', "field 'decode_context_tokens': missing"),
        (
            '{"step_idx": 0, "start_s": 0, "duration_s": -1, "prepare_s": 0, "update_s": 0, '
            '"request_ids": [], "prefill_chunks": [], "decode_context_tokens": [3]}',
            "duration_s must be finite and >= 0",
        ),
        (
            '{"step_idx": 0, "start_s": 0, "duration_s": 1, "prepare_s": 0, "update_s": 0, '
            '"request_ids": [], "prefill_chunks": [[1]], "decode_context_tokens": []}',
            "field 'prefill_chunks'",
        ),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "step_shapes.jsonl"
    write_step_shapes(path, [_record(0)])
    with path.open("a") as out:
        out.write(line + "\n")
    with pytest.raises(ValueError, match=r"step_shapes\.jsonl:2") as error:
        load_step_shapes(path)
    assert problem in str(error.value)


def test_a_compressed_file_reads_as_it_is(tmp_path: Path) -> None:
    """Recorded runs keep ``step_shapes.jsonl.gz``; the loader reads it without unpacking, and
    ``run_file`` finds it under the plain name's place."""
    import gzip

    from records.run_dir import run_file

    plain = tmp_path / "step_shapes.jsonl"
    records = [_record(0), _record(1)]
    write_step_shapes(plain, records)
    packed = tmp_path / "step_shapes.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    assert run_file(tmp_path, "step_shapes.jsonl") == packed
    assert load_step_shapes(run_file(tmp_path, "step_shapes.jsonl")) == records
