"""`traces.cli.main` in-process: `generate` writes a loadable, reproducible CSV; `info`
summarises any trace; bad input gives exit code 2 and a message, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces import load_trace
from traces.cli import main
from traces.generators import (
    GammaArrivals,
    LognormalLengths,
    SharedPrefix,
    UniformLengths,
    generate_trace,
)


def test_generate_writes_the_trace_generate_trace_would_make(tmp_path: Path) -> None:
    out = tmp_path / "bursty.csv"
    argv = [
        "generate",
        "-o",
        str(out),
        "--num-requests",
        "60",
        "--arrival",
        "gamma",
        "--rate",
        "3",
        "--cv",
        "2",
        "--lengths",
        "uniform",
        "--max-prompt-tokens",
        "300",
        "--num-prefixes",
        "2",
        "--prefix-tokens",
        "64",
        "--num-samples",
        "1,3",
        "--seed",
        "9",
    ]
    assert main(argv) == 0
    trace = load_trace(out)
    expected = generate_trace(
        60,
        GammaArrivals(3.0, 2.0),
        UniformLengths(max_prompt_tokens=300),
        seed=9,
        name="bursty",
        num_samples=[1, 3],
        shared_prefix=SharedPrefix(2, 64),
    )
    assert trace.requests == expected.requests
    assert trace.name == "bursty"


def test_generate_from_a_length_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "lengths.csv"
    table.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n7,3,10,2.3\n")
    out = tmp_path / "t.csv"
    argv = ["generate", "-o", str(out), "--lengths", "table", "--length-table", str(table)]
    assert main([*argv, "--num-requests", "5"]) == 0
    assert "wrote 5 requests" in capsys.readouterr().out
    assert {(r.prompt_tokens, r.output_tokens) for r in load_trace(out).requests} == {(7, 3)}


def test_info_prints_stats_and_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,x,5\n2,7,1\n")
    assert main(["info", str(path)]) == 2
    assert f"{path}:3: prompt_tokens: not a number: 'x'" in capsys.readouterr().err
    assert main(["info", str(path), "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "num_requests       2" in out
    assert "note: skipped 1 row(s)" in out


def test_bad_input_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "t.csv")
    assert main(["generate", "-o", out, "--lengths", "table"]) == 2
    assert "--length-table" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, naming the option
        main(["generate", "-o", out, "--rate", "0"])
    assert refused.value.code == 2
    assert "argument --rate: must be > 0" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["generate", "-o", out, "--num-samples", "two"])
    assert caught.value.code == 2


def test_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["generate", "--help"])
    assert caught.value.code == 0
    assert "coefficient of variation" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "notes"),
    [
        (
            ["--prompt-tokens", "500", "--output-tokens", "50"],
            [
                "--prompt-tokens: applies to --lengths fixed only",
                "--output-tokens: applies to --lengths fixed only",
            ],
        ),
        (["--cv", "5"], ["--cv: applies to --arrival gamma only"]),
        (["--length-table", "lengths.csv"], ["--length-table: applies to --lengths table only"]),
        (
            ["--prefix-tokens", "64", "--hash-block-tokens", "8", "--prefix-ids", "tokens"],
            [
                f"--{name}: applies with --num-prefixes 1 or more only"
                for name in ("prefix-tokens", "hash-block-tokens", "prefix-ids")
            ],
        ),
        (
            ["--lengths", "fixed", "--prompt-median", "100", "--max-output-tokens", "9"],
            [
                "--max-output-tokens: applies to --lengths uniform or lognormal only",
                "--prompt-median: applies to --lengths lognormal only",
            ],
        ),
        (
            ["--lengths", "lognormal", "--min-prompt-tokens", "3"],
            ["--min-prompt-tokens: applies to --lengths uniform only"],
        ),
        # Given to the model that reads them (even at their defaults): no note.
        (["--lengths", "fixed", "--prompt-tokens", "256"], []),
        (["--arrival", "gamma", "--cv", "1", "--num-prefixes", "1", "--prefix-ids", "hash"], []),
    ],
)
def test_an_option_the_trace_never_reads_is_named_and_the_trace_still_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], notes: list[str]
) -> None:
    out = tmp_path / "t.csv"
    assert main(["generate", "-o", str(out), "--num-requests", "5", *extra]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"note: {note}; it has no effect on this trace" for note in notes]
    assert len(load_trace(out)) == 5


def test_the_defaults_not_given_are_the_generator_classes(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    argv = ["generate", "-o", str(out), "--num-requests", "30", "--arrival", "gamma"]
    assert main([*argv, "--num-prefixes", "2"]) == 0
    expected = generate_trace(
        30, GammaArrivals(4.0), LognormalLengths(), name="t", shared_prefix=SharedPrefix(2)
    )
    assert load_trace(out).requests == expected.requests


def test_generate_writes_gzip_for_a_gz_name(tmp_path: Path) -> None:
    out = tmp_path / "t.csv.gz"
    assert main(["generate", "-o", str(out), "--num-requests", "7"]) == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    loaded = load_trace(out)
    assert len(loaded) == 7 and loaded.name == "t"


def test_generate_to_a_directory_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "-o", str(tmp_path), "--num-requests", "3"]) == 2
    assert f"-o {tmp_path}: is a directory" in capsys.readouterr().err
