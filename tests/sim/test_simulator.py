"""End-to-end simulator tests: every policy x memory model accounts for every request, runs are
byte-for-byte deterministic, the CLI reports bad input cleanly, and the bundled examples'
summaries match their golden files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy

from core.policies import POLICIES
from core.request import RequestStatus
from core.settings import build
from sim.cli.main import main
from sim.run import RunConfig, simulate
from sim.simulator import timeout_at
from traces.loaders import load_trace

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "traces" / "data"
GOLDEN = Path(__file__).resolve().parent / "golden"
# Small enough to be quick, small enough to preempt: 600 blocks x 16 tokens.
SMALL = {"model": "Llama-2-7B", "hardware": "A100-80GB", "num_blocks": 600}
GOLDEN_CASES = {
    "example_chunked": ("example.csv", {"policy": "chunked"}),
    "example_static_contiguous": ("example.csv", {"policy": "static"}),
    "shared_prefix_continuous_prefix_caching": (
        "shared_prefix.csv",
        {"policy": "continuous", "enable_prefix_caching": True},
    ),
    "parallel_sampling_chunked_swap": (
        "parallel_sampling.csv",
        {"policy": "chunked", "preemption_mode": "swap", "num_blocks": 400},
    ),
}


@pytest.mark.parametrize("memory", ["paged", "contiguous"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_request_is_accounted_for(policy: str, memory: str) -> None:
    trace = load_trace(DATA / "parallel_sampling.csv")
    config = build(RunConfig, policy=policy, memory_model=memory, **SMALL)  # type: ignore[arg-type]
    result = simulate(trace, config)
    assert len(result.requests) == len(trace)
    for request in result.requests:
        assert request.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
        if request.status is RequestStatus.REJECTED:
            assert request.reject_reason
        else:
            assert request.num_output_tokens == request.max_output_tokens
    assert result.summary["completed"] + result.summary["rejected"] == len(trace)
    assert len(result.steps) > 0


def test_same_inputs_give_byte_identical_outputs(tmp_path: Path) -> None:
    trace = str(DATA / "bursty.csv")
    args = ["run", trace, "--policy", "chunked", "--num-blocks", "500", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    for name in ("requests.csv", "steps.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # The summary records the command, whose --out differs; everything else is identical.
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a.pop("command").endswith("/a") and b.pop("command").endswith("/b")
    assert a == b


def test_preemption_happens_and_is_reported_under_memory_pressure() -> None:
    trace = load_trace(DATA / "example.csv")
    config = build(
        RunConfig, policy="continuous", model="Llama-2-7B", hardware="A100-80GB", num_blocks=120
    )
    result = simulate(trace, config)
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_recomputed_tokens"] > 0
    assert result.summary["completed"] + result.summary["rejected"] == len(trace)


def test_cli_reports_bad_trace_rows_with_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n1,0.0,abc,5\n2,0.1,10,5\n")
    assert main(["run", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:2" in err and "prompt_tokens" in err
    assert (
        main(["run", str(bad), "--quiet", "--on-error", "skip", "--out", str(tmp_path / "o")]) == 0
    )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_skipped_rows"] == 1
    assert summary["summary"]["num_requests"] == 1


def test_cli_rejects_impossible_config_without_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "run",
            str(DATA / "example.csv"),
            "--model",
            "Llama-2-70B",
            "--hardware",
            "A100-40GB",
            "--quiet",
        ]
    )
    assert code == 2
    assert "error:" in capsys.readouterr().err


def _golden_summary(name: str) -> dict[str, object]:
    trace_file, overrides = GOLDEN_CASES[name]
    config = build(RunConfig, **{"model": "Llama-2-7B", "hardware": "A100-80GB", **overrides})
    result = simulate(load_trace(DATA / trace_file), config)
    summary: dict[str, object] = dict(result.summary)
    summary["mean_real_token_share"] = result.mean_real_token_share
    return json.loads(json.dumps(summary, sort_keys=True))  # normalise floats as stored


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_bundled_example_matches_golden_summary(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    assert path.exists(), "missing golden file; run: python tests/sim/test_simulator.py"
    expected = json.loads(path.read_text())
    actual = _golden_summary(name)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        # Counts must match exactly; floats to 1e-9 (summation order may differ by a ulp).
        if isinstance(value, float):
            assert actual[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert actual[key] == value, key


if __name__ == "__main__":
    # Regenerate the golden files after an intended change of behaviour.
    for case in GOLDEN_CASES:
        (GOLDEN / f"{case}.json").write_text(
            json.dumps(_golden_summary(case), indent=2, sort_keys=True) + "\n"
        )
        print("wrote", case)


def test_a_simulation_collects_garbage_less_often_and_restores_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``simulate`` raises the collector's first threshold while it runs (sim/run.py) and puts
    back the caller's setting afterwards, also when the run fails."""
    import gc

    import sim.run
    from sim.deployment import run_deployment

    seen: list[tuple[int, int, int]] = []

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_threshold())
        return run_deployment(*args, **kwargs)  # type: ignore[arg-type]

    def fail(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_threshold())
        raise RuntimeError("boom")

    before = gc.get_threshold()
    trace = load_trace(DATA / "example.csv")
    try:
        gc.set_threshold(700, 10, 10)
        monkeypatch.setattr(sim.run, "run_deployment", spy)
        simulate(trace, build(RunConfig, policy="continuous", **SMALL))  # type: ignore[arg-type]
        assert seen[-1] == (sim.run._GC_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(10 * sim.run._GC_THRESHOLD, 5, 5)  # a higher setting is kept
        monkeypatch.setattr(sim.run, "run_deployment", fail)
        with pytest.raises(RuntimeError, match="boom"):
            simulate(trace, build(RunConfig, policy="continuous", **SMALL))  # type: ignore[arg-type]
        assert seen[-1] == (10 * sim.run._GC_THRESHOLD, 5, 5)
        assert gc.get_threshold() == (10 * sim.run._GC_THRESHOLD, 5, 5)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("start_s", "end_s"),
    [
        # From this start no delay reaches the end: now + delay rounds to even (the draw that
        # found it: tests/sim/fastforward/test_fast_forward_differential.py).
        (0.03063116709890469, 0.20559742527382704),
        (0.0, 0.1),
        (0.2, 0.2),
    ],
)
def test_timeout_at_ends_at_exactly_the_time_asked(start_s: float, end_s: float) -> None:
    env = simpy.Environment(initial_time=start_s)
    seen: list[float] = []

    def wait() -> simpy.events.ProcessGenerator:
        yield timeout_at(env, end_s)
        seen.append(env.now)

    env.process(wait())
    env.run()
    assert seen == [end_s]
