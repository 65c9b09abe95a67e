"""Sweeps: the TOML spec, one ordinary run per point, sweep.csv, resume, failing points, and
byte-identical sweep.csv from every executor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from records.sweep_table import load_sweep_csv, option_columns
from sim.cli.main import main
from sim.cli.options import config_from_args
from sim.cli.parser import build_parser
from sim.experiments.sweep import PointTask, check_ray_address, execute, open_workers, run_sweep
from sim.experiments.sweep_spec import load_spec, point_config, scale_trace, unused_in_points
from sim.run import simulate
from traces.loaders import load_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "data" / "example.csv"

SPEC = f"""
[trace]
path = "{EXAMPLE}"
rates = [3.0, 12.0]

[run]
slo-ttft = 300
slo_tpot = 40

[grid]
policy = ["continuous", "chunked"]

[[points]]
policy = "static"
rate = 6.0
"""


def write_spec(tmp_path: Path, text: str = SPEC, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_spec_grid_times_rates_plus_listed_points(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    assert len(spec.points) == 5
    assert spec.points[0] == {"policy": "continuous", "rate": 3.0, "slo_tpot": 40, "slo_ttft": 300}
    assert spec.points[-1]["policy"] == "static" and spec.points[-1]["rate"] == 6.0
    assert spec.option_names == ["policy", "rate", "slo_tpot", "slo_ttft"]


def test_point_means_what_the_same_run_flags_mean() -> None:
    options = {"policy": "continuous", "max_num_seqs": 32, "prefix_caching": True, "tp": 2}
    argv = ["run", "t.csv", "--policy", "continuous", "--max-num-seqs", "32"]
    expected = config_from_args(build_parser().parse_args([*argv, "--prefix-caching", "--tp", "2"]))
    assert point_config(options) == expected
    assert point_config({**options, "prefix_caching": False}).cache.enable_prefix_caching is False


def test_points_take_the_field_names_and_the_old_flag_spellings() -> None:
    new = {"max_num_batched_tokens": 512, "enable_prefix_caching": True, "memory_model": "paged"}
    old = {"max-batch-tokens": 512, "prefix-caching": True, "memory": "paged"}
    config = point_config(new)
    assert config == point_config(old)
    assert config.scheduler.max_num_batched_tokens == 512 and config.cache.enable_prefix_caching
    swap = {"preemption_mode": "swap"}
    assert point_config(swap) == point_config({"preemption": "swap"})
    assert point_config(swap).scheduler.preemption_mode == "swap"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[trace]\npath = "x.csv"\n[grid]\npolisy = ["static"]', "unknown run option 'polisy'"),
        (f'[trace]\npath = "{EXAMPLE}"\n[grid]\npolicy = ["fast"]', "invalid choice: 'fast'"),
        (f'[trace]\npath = "{EXAMPLE}"\n[grid]\nmax-num-seqs = []', "non-empty list"),
        (f'[trace]\npath = "{EXAMPLE}"\n[run]\nprefix-caching = 1', "give true or false"),
        (f'[trace]\npath = "{EXAMPLE}"\n[run]\nout = "x"', "'out' is set by [trace]"),
        ("[grid]\npolicy = ['static']", "exactly one of [trace]"),
        ("[trace\n", "not valid TOML"),
        (f'[trace]\npath = "{EXAMPLE}"\n[extra]\na = 1', "unknown table 'extra'"),
        (f'[trace]\npath = "{EXAMPLE}"\nfoo = 1', "[trace]: unknown key(s) ['foo']"),
        ("[trace]\nformat = 'vidur'", "[trace]: needs path = '...' (the trace file)"),
        ("[generator]\nrate = 3", "set rates = [...]"),
        ("[generator]\nlengths = 'nope'", "[generator]: argument --lengths"),
        # Values no point could use are refused before any point runs.
        ('[trace]\npath = "/nonexist.csv"', "[trace]: trace file /nonexist.csv does not exist"),
        (f'[trace]\npath = "{EXAMPLE}"\nrates = [-1.0]', "rate must be a number > 0 req/s"),
        (f'[trace]\npath = "{EXAMPLE}"\n[run]\nrate = "fast"', "rate must be a number > 0"),
        (f'[trace]\npath = "{EXAMPLE}"\n[grid]\nhardware = ["H100"]', "hardware: unknown"),
        (f'[trace]\npath = "{EXAMPLE}"\n[run]\nmodel = "no.json"', "model: unknown model"),
        (
            f'[trace]\npath = "{EXAMPLE}"\n[grid]\npolicy = ["chunked", "static", "chunked"]',
            "[grid] 'policy' lists 'chunked' more than once",
        ),
        (
            f'[trace]\npath = "{EXAMPLE}"\n[grid]\nmax-num-seqs = [4]\nmax_num_seqs = [8]',
            "'max-num-seqs' and 'max_num_seqs' set the same option",
        ),
        (
            f'[trace]\npath = "{EXAMPLE}"\n[run]\nmax-batch-tokens = 512\n'
            "max-num-batched-tokens = 1024",
            "'max-batch-tokens' and 'max-num-batched-tokens' set the same option",
        ),
    ],
)
def test_bad_spec_is_an_error_naming_file_and_field(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_spec(tmp_path, text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and message in err, err
    assert "Traceback" not in err


def test_scale_trace_sets_the_mean_rate() -> None:
    trace = load_trace(str(EXAMPLE))
    scaled = scale_trace(trace, 10.0)
    assert scaled.mean_rate_per_s == pytest.approx(10.0)
    assert [r.prompt_tokens for r in scaled.requests] == [r.prompt_tokens for r in trace.requests]
    with pytest.raises(ValueError, match="rate must be > 0"):
        scale_trace(trace, 0.0)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    spec = write_spec(root)
    assert main(["sweep", str(spec), "--out", str(root / "out"), "--quiet"]) == 0
    return root


def test_every_point_is_an_ordinary_run_with_its_own_folder(swept: Path) -> None:
    frame = load_sweep_csv(swept / "out" / "sweep.csv")
    assert list(frame["point"]) == [0, 1, 2, 3, 4]
    assert set(frame["status"]) == {"ok"}
    assert option_columns(swept / "out" / "sweep.csv", frame) == [
        "policy",
        "rate",
        "slo_tpot",
        "slo_ttft",
    ]
    row = frame.iloc[3]  # chunked at 12 req/s
    assert (row["policy"], row["rate"]) == ("chunked", 12.0)
    folder = swept / "out" / row["run_dir"]
    assert {p.name for p in folder.iterdir()} == {"requests.csv", "steps.csv", "summary.json"}
    config = point_config({"policy": "chunked", "slo_ttft": 300, "slo_tpot": 40})
    direct = simulate(scale_trace(load_trace(str(EXAMPLE)), 12.0), config)
    for key in ("completed", "p99_ttft_ms", "mean_tpot_ms", "request_goodput", "duration_s"):
        assert row[key] == direct.summary[key], key
    saved = json.loads((folder / "summary.json").read_text())
    assert saved["config"]["policy"] == "chunked" and saved["summary"] == direct.summary
    assert len(pd.read_csv(folder / "requests.csv")) == 200


def test_resume_skips_complete_points_and_reruns_broken_ones(swept: Path, tmp_path: Path) -> None:
    spec, out = swept / "spec.toml", swept / "out"
    first = (out / "sweep.csv").read_bytes()
    again = run_sweep(spec, out)
    assert again.num_resumed == 5
    assert (out / "sweep.csv").read_bytes() == first
    broken = out / again.rows[1]["run_dir"] / "summary.json"
    broken.write_text(broken.read_text()[:100])  # cut off mid-write
    assert run_sweep(spec, out).num_resumed == 4
    assert (out / "sweep.csv").read_bytes() == first
    # Same folder, other options: the stored options differ, so it runs again.
    payload = json.loads(broken.read_text())
    payload["sweep_point"]["options"]["policy"] = "static"
    broken.write_text(json.dumps(payload))
    assert run_sweep(spec, out).num_resumed == 4


def test_a_failing_point_records_its_error_and_the_sweep_goes_on(tmp_path: Path) -> None:
    text = SPEC + '\n[[points]]\npolicy = "continuous"\nnum-blocks = 1\n'
    outcome = run_sweep(write_spec(tmp_path, text), tmp_path / "out")
    frame = load_sweep_csv(outcome.csv_path)
    assert list(frame["status"]) == ["ok"] * 5 + ["error"]
    assert "num_blocks must be >= 2" in frame["error"].iloc[5]
    assert frame["completed"].isna().iloc[5]
    assert run_sweep(tmp_path / "spec.toml", tmp_path / "out").num_resumed == 5


def test_local_processes_write_the_same_bytes(swept: Path, tmp_path: Path) -> None:
    outcome = run_sweep(swept / "spec.toml", tmp_path / "parallel", jobs=2)
    assert outcome.num_resumed == 0
    assert outcome.csv_path.read_bytes() == (swept / "out" / "sweep.csv").read_bytes()


def test_generator_source_with_rates(tmp_path: Path) -> None:
    text = """
[generator]
num-requests = 40
lengths = "fixed"
prompt-tokens = 64
output-tokens = 8
rates = [2.0, 50.0]
"""
    outcome = run_sweep(write_spec(tmp_path, text), tmp_path / "out")
    frame = load_sweep_csv(outcome.csv_path)
    assert list(frame["rate"]) == [2.0, 50.0]
    assert list(frame["total_input_tokens"]) == [40 * 64, 40 * 64]
    assert frame["duration_s"].iloc[0] > 5 * frame["duration_s"].iloc[1]


def test_ray_writes_the_same_bytes(swept: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    # No ADDRESS: a fresh local instance (two CPUs), shut down when the sweep ends.
    assert main(["sweep", str(swept / "spec.toml"), "--out", str(out), "--ray", "-j", "2"]) == 0
    assert (out / "sweep.csv").read_bytes() == (swept / "out" / "sweep.csv").read_bytes()
    for row in load_sweep_csv(out / "sweep.csv").itertuples():
        for name in ("requests.csv", "steps.csv", "summary.json"):
            local = swept / "out" / str(row.run_dir) / name
            assert (out / str(row.run_dir) / name).read_bytes() == local.read_bytes(), name
    import ray

    assert not ray.is_initialized()


def test_ray_without_the_extra_is_a_clear_error(
    swept: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the extra
    argv = ["sweep", str(swept / "spec.toml"), "--out", str(tmp_path / "o"), "--ray", "--quiet"]
    assert main(argv) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:1", "no Ray cluster answers there"),  # port 1: nobody listens
        ("somewhere", "give HOST:PORT, 'auto', or nothing"),
    ],
)
def test_a_ray_address_nobody_answers_at_fails_fast(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_ray_address(address)


def test_workers_are_opened_once_for_many_batches(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    tasks = [PointTask(i, tuple(p.items()), spec.source) for i, p in enumerate(spec.points)]
    with open_workers(2) as workers:
        assert workers.num_workers == 2
        first = execute(tasks[:2], workers, keep_files=False)
        second = execute(tasks[2:], workers, keep_files=False)
    rows = [o.row for o in [*first, *second]]
    assert [row["point"] for row in rows] == [0, 1, 2, 3, 4]
    assert all(row["status"] == "ok" for row in rows)
    assert all(o.extra["cpu_s"] > 0 for o in [*first, *second])


def test_sweep_prints_its_points_as_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["point"])
    assert "policy" in lines[head] and "req/s" in lines[head] and "TTFT p99 ms" in lines[head]
    rows = load_sweep_csv(tmp_path / "out" / "sweep.csv")
    body = lines[head + 1 : head + 1 + len(rows)]
    for line, (_, row) in zip(body, rows.iterrows(), strict=True):
        cells = line.split()
        assert cells[0] == str(row["point"]) and row["policy"] in cells
        assert f"{row['request_throughput']:.3f}" in cells and cells[-1] == "ok"


def test_an_option_some_points_never_read_is_named_before_the_sweep_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # [run] options go to every point, so a static batch size reaches the chunked points too.
    text = SPEC.replace("slo_tpot = 40\n", "slo_tpot = 40\nbatch-size = 4\n")
    spec = write_spec(tmp_path, text)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: --batch-size: applies to static and dynamic batching, not continuous "
        "(in 2 of 5 points); it has no effect there",
        "note: --batch-size: applies to static and dynamic batching, not chunked "
        "(in 2 of 5 points); it has no effect there",
    ]
    assert unused_in_points(load_spec(write_spec(tmp_path)).points) == []


def test_a_point_can_repeat_the_trace_and_rows_are_judged(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        f'[trace]\npath = "{EXAMPLE}"\n[run]\nslo-ttft = 300\nslo-tpot = 40\nrate = 30.0\n'
        "[grid]\nrepeats = [1, 3]\npolicy = ['static', 'chunked']\n",
    )
    outcome = run_sweep(spec, tmp_path / "out")
    rows = {(r["policy"], r["repeats"]): r for r in outcome.rows}
    assert rows["chunked", 3]["num_requests"] == 3 * rows["chunked", 1]["num_requests"] == 600
    assert rows["static", 3]["overloaded"] is True and rows["chunked", 1]["overloaded"] is False
    for row in outcome.rows:
        assert row["slo_attainment_low"] <= row["slo_attainment"] <= row["slo_attainment_high"]
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        load_spec(write_spec(tmp_path, f'[trace]\npath = "{EXAMPLE}"\n[run]\nrepeats = 0\n'))


def test_a_sweep_with_a_failed_point_exits_1_and_names_it_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # num-blocks 1 passes the run parser; only the run itself refuses it.
    text = (
        f'[trace]\npath = "{EXAMPLE}"\n[[points]]\nmax-num-seqs = 8\n[[points]]\nnum-blocks = 1\n'
    )
    spec = write_spec(tmp_path, text)
    for quiet in (["--quiet"], []):
        assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), *quiet]) == 1
        captured = capsys.readouterr()
        assert captured.err.splitlines()[0].startswith(
            "error: point 1 {'num_blocks': 1}: ConfigError: num_blocks must be >= 2"
        )
        assert "error: 1 of 2 points failed" in captured.err
        assert (captured.out == "") == bool(quiet)


def test_listed_points_alone_are_the_points(tmp_path: Path) -> None:
    # No [grid]: the points are those listed, without a [run]-only point before them.
    text = f'[trace]\npath = "{EXAMPLE}"\n[run]\ntp = 1\n[[points]]\nmax-num-seqs = 8\n'
    assert load_spec(write_spec(tmp_path, text)).points == ({"max_num_seqs": 8, "tp": 1},)
    assert len(load_spec(write_spec(tmp_path, f'[trace]\npath = "{EXAMPLE}"\n')).points) == 1


def test_a_point_listed_twice_is_refused_before_anything_runs(tmp_path: Path) -> None:
    text = SPEC + '\n[[points]]\npolicy = "static"\nrate = 6.0\n'
    with pytest.raises(ValueError, match="points 4 and 5 are the same run"):
        run_sweep(write_spec(tmp_path, text), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_generator_option_the_generator_never_reads_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "[generator]\nnum-requests = 20\ncv = 3\nprompt-tokens = 64\nrates = [4.0]\n"
    assert main(["sweep", str(write_spec(tmp_path, text)), "--out", str(tmp_path / "o")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: [generator] --cv: applies to --arrival gamma only; it has no effect there",
        "note: [generator] --prompt-tokens: applies to --lengths fixed only; it has no effect "
        "there",
    ]


def test_a_row_names_why_requests_were_rejected(tmp_path: Path) -> None:
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,9000,10\n2,9500,10\n")
    outcome = run_sweep(write_spec(tmp_path, f'[trace]\npath = "{trace}"\n'), tmp_path / "out")
    row = outcome.rows[0]
    assert (row["status"], row["rejected"]) == ("ok", 2)
    assert row["reject_reason"].startswith("prompt 9000 + max output 10 tokens exceeds")


def test_a_report_path_that_is_a_directory_is_refused_before_any_point_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(f'[trace]\npath = "{EXAMPLE}"\n[grid]\npolicy = ["chunked"]\n')
    argv = ["sweep", str(spec), "--out", str(tmp_path / "o"), "--report", str(tmp_path)]
    assert main(argv) == 2
    assert f"--report {tmp_path}: is a directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
