"""``validate --replay RUN``: the simulator replays the run's own settings, so a KV cache or
scheduler flag the run did not run with is refused (not dropped in silence), and so is a
calibration on another kind of device than the run's; a second ``--replay`` that is not a
rerun of the first is refused (it would not be the engine against itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fidelity.cli.replay_checks import check_replay_options, check_rerun
from sim.cli.parser import build_parser

RECORDED = {
    "model": "llama-3-8b",
    "device": "cuda",
    "policy": "chunked",
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
}


def _check(tmp_path: Path, *flags: str, summary: dict | None = None) -> None:
    run = tmp_path / "run1"
    run.mkdir(exist_ok=True)
    summary = summary or {"config": RECORDED, "num_blocks": 5000}
    (run / "summary.json").write_text(json.dumps(summary))
    args = build_parser().parse_args(["validate", "--replay", str(run), "--out", "o", *flags])
    check_replay_options(str(run), summary, args)


def test_settings_the_run_ran_with_may_be_given(tmp_path: Path) -> None:
    _check(tmp_path, "--profile", "p.json")
    _check(tmp_path, "--profile", "p.json", "--max-num-seqs", "256", "--block-size", "16")
    _check(tmp_path, "--profile", "p.json", "--num-blocks", "5000")
    # A setting the run did not record ran at the default, and the replay uses the default.
    _check(tmp_path, "--profile", "p.json", "--preemption-mode", "recompute")


def test_a_setting_the_run_did_not_run_with_is_refused_with_what_it_ran(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        _check(tmp_path, "--profile", "p.json", "--max-num-seqs", "8", "--block-size", "32")
    message = str(err.value)
    assert "run1/summary.json" in message
    assert "--block-size 32 (the run: 16), --max-num-seqs 8 (the run: 256)" in message
    with pytest.raises(ValueError, match=r"--num-blocks 64 \(the run: 5000\)"):
        _check(tmp_path, "--profile", "p.json", "--num-blocks", "64")
    with pytest.raises(ValueError, match=r"--enable-prefix-caching True \(the run: False\)"):
        _check(tmp_path, "--profile", "p.json", "--enable-prefix-caching")


def test_calibrating_on_another_device_than_the_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"made on cuda .* on --device cpu here"):
        _check(tmp_path)
    _check(tmp_path, "--device", "cuda")  # on a machine like the run's
    _check(tmp_path, "--device", "cuda:1")
    cpu_run = {"config": {**RECORDED, "device": "cpu"}, "num_blocks": 5000}
    _check(tmp_path, summary=cpu_run)


def test_a_second_replay_must_be_a_rerun_of_the_first() -> None:
    first = {"config": RECORDED, "num_blocks": 5000, "trace": "example"}
    assert check_rerun("run1", first, "run2", json.loads(json.dumps(first))) is None
    other = {"config": {**RECORDED, "max_num_seqs": 1}, "num_blocks": 2, "trace": "shared"}
    with pytest.raises(ValueError) as err:
        check_rerun("run1", first, "run2", other)
    message = str(err.value)
    assert message.startswith("--replay run2: not a rerun of run1")
    assert "max_num_seqs 1 (the first: 256)" in message
    assert "trace 'shared' (the first: 'example')" in message
    # A GPU engine sizes its cache from the memory free at start: said, not refused.
    note = check_rerun("run1", first, "run2", {**first, "num_blocks": 4990})
    assert note is not None and "holds 4990 blocks, run1's 5000" in note
