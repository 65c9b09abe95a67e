"""``python -m engine gpu-check`` on CPU: the orchestration with fake parts (small real
commands): a failure or a timeout is recorded and the next part runs, a timed-out part's
processes are gone, the budget skips what no longer fits and says so, a part needing one that
failed is skipped, and the summary (markdown and JSON) holds it all. Then ``--dry-run``, which
CI runs: it lists every part and checks its command's flags, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine.affinity import current_cores  # noqa: E402
from engine.cli import main as engine_main  # noqa: E402
from engine.gpu_check import command, summary  # noqa: E402
from engine.gpu_check.environment import hardware_preset  # noqa: E402
from engine.gpu_check.parts import (  # noqa: E402
    CheckSettings,
    Command,
    Part,
    environment_part,
    pinned_cores,
    plan,
)
from engine.gpu_check.run import Check  # noqa: E402


def _python(code: str) -> Command:
    return Command(("-c", code))


def _part(name: str, code: str, **kwargs: Any) -> Part:
    fields: dict[str, Any] = {"estimate_s": 1.0, "limit_s": 60.0, **kwargs}
    return Part(name, f"fake part {name}", (_python(code),), **fields)


def _check(out: Path, budget_s: float = 600.0, **kwargs: Any) -> Check:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    header = {"model": "fake"}
    return Check(
        out,
        budget_s,
        sys.executable,
        env,
        on_result=lambda results: summary.write_summary(out, header, results),
        **kwargs,
    )


def _figures(folder: Path) -> dict[str, Any]:
    return {"said": (folder / "log.txt").read_text().splitlines()[-1]}


def test_each_part_reports_and_the_next_runs(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    sleeper = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    parts = [
        _part("works", "print('fine')", read=_figures),
        _part("breaks", "import sys; print('something broke'); sys.exit(3)"),
        _part("hangs", sleeper, limit_s=3.0),
        _part("after-breaks", "print('never')", after=("breaks",)),
        _part("after-works", "print('runs')", after=("works",), read=_figures),
        _part("needs-a-module", "print('never')", modules=("no_such_module_here",)),
    ]
    results = {r.name: r for r in _check(tmp_path).run(parts)}
    assert [r.status for r in results.values()] == [
        "passed", "failed", "timed out", "skipped", "passed", "skipped",
    ]  # fmt: skip
    assert results["works"].figures == {"said": "fine"}
    assert results["breaks"].returncode == 3
    assert results["breaks"].reason == "exit code 3: $ " + results["breaks"].commands[0] + (
        " | something broke"
    )
    assert results["hangs"].reason == "stopped at 3 s" and 3 <= results["hangs"].wall_s < 20
    # The whole process group went: the part's own child too.
    assert not _running(int(pid_file.read_text()))
    assert results["after-breaks"].reason == "needs breaks to have passed"
    assert results["needs-a-module"].reason == "needs no_such_module_here (not installed)"
    assert "[gpu-check: stopped after 3 s]" in (tmp_path / "hangs" / "log.txt").read_text()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that does not reap it does not)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


class FakeClock:
    """Seconds that pass only when a part runs: each launch advances it by ``per_launch_s``."""

    def __init__(self, per_launch_s: float) -> None:
        self.now_s, self.per_launch_s = 0.0, per_launch_s

    def __call__(self) -> float:
        return self.now_s

    def launch(self, argv: list[str], log: Path, timeout_s: float, env: dict[str, str]) -> int:
        self.now_s += self.per_launch_s
        log.write_text(f"$ {argv[-1]}\n")
        return 0


def test_the_budget_skips_what_no_longer_fits_and_says_so(tmp_path: Path) -> None:
    clock = FakeClock(per_launch_s=40.0)
    parts = [
        _part("first", "1", estimate_s=40),
        _part("second", "2", estimate_s=40),
        _part("too-long", "3", estimate_s=30),
        _part("short", "4", estimate_s=4),
    ]
    check = _check(tmp_path, budget_s=100.0, launcher=clock.launch, clock=clock)
    results = check.run(parts)
    assert [r.status for r in results] == ["passed", "passed", "skipped", "passed"]
    # 100 s less 80 s spent and 15 s kept back (a stopped part's grace, the summary): 5 s left.
    assert results[2].reason == "needs about 30 s, 5 s of the budget left"
    # A part never runs past the budget: its timeout is what is left.
    seen: list[float] = []

    def launcher(argv: list[str], log: Path, timeout_s: float, env: dict[str, str]) -> int:
        seen.append(timeout_s)
        return 0

    _check(tmp_path / "b", budget_s=50.0, launcher=launcher).run([_part("x", "1", limit_s=600)])
    assert seen and 34 < seen[0] <= 35


def test_the_summary_holds_every_part(tmp_path: Path) -> None:
    parts = [
        _part("works", "print('fine')", read=_figures),
        _part("breaks", "import sys; sys.exit(1)"),
        _part("skipped", "print()", after=("breaks",)),
    ]
    _check(tmp_path).run(parts)
    data = json.loads((tmp_path / summary.SUMMARY_JSON).read_text())
    assert data["model"] == "fake"
    assert data["counts"] == {"passed": 1, "failed": 1, "timed out": 0, "skipped": 1}
    assert [p["name"] for p in data["parts"]] == ["works", "breaks", "skipped"]
    assert data["parts"][0]["figures"] == {"said": "fine"}
    assert data["parts"][0]["log"] == "works/log.txt"
    text = (tmp_path / summary.SUMMARY_MD).read_text()
    assert "| works | passed |" in text and "said fine" in text
    assert "| breaks | failed |" in text and "exit code 1" in text
    assert "| skipped | skipped | 0 s | needs breaks to have passed |" in text
    assert "- parts: 1 passed, 1 failed, 1 skipped" in text


def test_a_keep_going_part_runs_every_command_and_fails_on_the_first_failure(
    tmp_path: Path,
) -> None:
    commands = (
        _python("import sys; print('first broke'); sys.exit(2)"),
        _python("print('second ran')"),
        _python("import sys; sys.exit(5)"),
    )
    fields: dict[str, Any] = {"estimate_s": 1.0, "limit_s": 60.0}
    on = Part("on", "keeps going", commands, keep_going=True, **fields)
    off = Part("off", "stops", commands, **fields)
    results = {r.name: r for r in _check(tmp_path).run([on, off])}
    assert results["on"].status == results["off"].status == "failed"
    assert results["on"].reason.startswith("exit code 2:")
    assert "second ran" in (tmp_path / "on" / "log.txt").read_text()
    assert "second ran" not in (tmp_path / "off" / "log.txt").read_text()


def test_unreadable_results_fail_the_part(tmp_path: Path) -> None:
    def unreadable(folder: Path) -> dict[str, Any]:
        raise ValueError(f"{folder / 'x.json'}: missing")

    (result,) = _check(tmp_path).run([_part("quiet", "pass", read=unreadable)])
    assert result.status == "failed" and result.reason.startswith("results: ")


def test_parts_are_chosen_by_name(tmp_path: Path) -> None:
    parts = plan(CheckSettings(out=tmp_path))
    names = [p.name for p in parts]
    assert names[0] == "gpu-tests" and "engine-self" in names
    assert [p.name for p in command.select(parts, "calibrate,engine-self", None)] == [
        "calibrate", "engine-self",
    ]  # fmt: skip
    assert "gpu-tests" not in [p.name for p in command.select(parts, None, "gpu-tests")]
    with pytest.raises(ValueError, match=r"--only: no part named \['calibrat'\]"):
        command.select(parts, "calibrat", None)


def test_graphs_add_the_eager_runs(tmp_path: Path) -> None:
    eager = {p.name: p for p in plan(CheckSettings(out=tmp_path))}
    graphs = {p.name: p for p in plan(CheckSettings(out=tmp_path, graphs=True))}
    assert "bench-engine-eager" in graphs and "bench-engine-eager" not in eager
    assert len(graphs["profile-decode"].commands) == 2
    assert "--enforce-eager" in graphs["profile-decode"].commands[1].args
    # The eager engine as the engine with graphs: calibrated, run twice, validated on both.
    assert all("--enforce-eager" in c.args for c in graphs["engine-self-eager"].commands)
    validate = graphs["validate-example-chunked-eager"]
    assert validate.after == ("calibrate-eager", "engine-self-eager")
    assert str(tmp_path / "engine-self-eager" / "run2") in validate.commands[0].args
    assert "engine-self-eager" not in eager
    flagged = {p.name: p for p in plan(CheckSettings(out=tmp_path, bench_graph_flag="--graph"))}
    assert flagged["kernels-bench"].commands[0].args[-1] == "--graph"


def test_piecewise_graphs_add_their_engine_run(tmp_path: Path) -> None:
    without = {p.name for p in plan(CheckSettings(out=tmp_path, graphs=True))}
    assert "engine-piecewise" not in without
    parts = {p.name: p for p in plan(CheckSettings(out=tmp_path, graphs=True, piecewise=True))}
    part = parts["engine-piecewise"]
    args = part.commands[0].args
    assert args[args.index("--mixed-graphs") + 1] == "piecewise"
    assert args[args.index("--out") + 1] == str(tmp_path / "engine-piecewise" / "run1")
    assert part.after == ("engine-self",) and part.read is not None
    # This source's engine has the option, so the check finds it.
    assert command.detect(tmp_path, "llama-3-8b", "bfloat16", None).piecewise
    # And that engine as the default one: calibrated, run twice, validated on both runs.
    for name in ("calibrate-piecewise", "engine-self-piecewise"):
        for c in parts[name].commands:
            assert c.args[c.args.index("--mixed-graphs") + 1] == "piecewise"
    assert len(parts["engine-self-piecewise"].commands) == 2
    validate = parts["validate-example-chunked-piecewise"]
    assert validate.after == ("calibrate-piecewise", "engine-self-piecewise")
    args = validate.commands[0].args
    assert args[args.index("--profile") + 1] == str(
        tmp_path / "calibrate-piecewise" / "profile.json"
    )
    assert str(tmp_path / "engine-self-piecewise" / "run2") in args
    assert "calibrate-piecewise" not in without


def test_flags_are_checked_against_help() -> None:
    text = "usage: x [--model MODEL] [-m MARKEXPR]\n  --time-scale T  stretch"
    args = ("trace.csv", "--model", "m", "--time-scale=2", "-m", "gpu", "--mdl", "-n", "4")
    assert command.unknown_flags(args, text) == ["--mdl", "-n"]


def test_the_device_names_its_hardware_preset() -> None:
    assert hardware_preset("NVIDIA H200") == "H200"
    assert hardware_preset("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert hardware_preset("NVIDIA A100-SXM4-80GB", 85 * (1 << 30)) == "A100-80GB"
    assert hardware_preset("NVIDIA L4") is None


def test_the_entry_point_is_provided_when_servesim_is_not_installed(tmp_path: Path) -> None:
    command.write_entry_point(tmp_path)
    code = (
        "from importlib.metadata import entry_points; "
        "print(sorted((e.dist.name, e.value) for e in entry_points(group='servesim.commands')))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "('servesim-gpu-check', 'fidelity.cli')" in done.stdout


def test_the_environment_part_describes_the_machine(tmp_path: Path) -> None:
    part = environment_part(CheckSettings(out=tmp_path))
    (result,) = _check(tmp_path).run([part])
    assert result.status == "passed", result.reason
    assert result.figures["device"] == "cpu" and result.figures["hardware"] is None
    assert result.figures["torch"]
    assert result.figures["cpu_cores"] == sorted(os.sched_getaffinity(0))


def test_a_command_with_an_unknown_flag_is_a_problem(tmp_path: Path) -> None:
    part = Part(
        "bad",
        "a flag the environment part does not have",
        (Command(("-m", "engine.gpu_check.environment"), ("--out", "x", "--nope")),),
        estimate_s=1,
        limit_s=10,
        inputs=("traces/data/no_such.csv",),
    )
    problems = command.check_parts([part], sys.executable, dict(os.environ))
    assert problems == {
        "bad": [
            "input traces/data/no_such.csv missing",
            "-m engine.gpu_check.environment: unknown flag --nope",
        ]
    }


@pytest.mark.slow
def test_the_dry_run_lists_and_checks_every_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "check"
    assert engine_main(["gpu-check", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    for part in [environment_part(CheckSettings(out=out)), *plan(CheckSettings(out=out))]:
        assert f"\n{part.name} " in text
    assert "every part's command checks out" in text
    assert "$ python -m sim calibrate --model llama-3-8b --device cuda" in text
    assert not out.exists()
    # The budget it states is the one given.
    argv = ["gpu-check", "--out", str(out), "--dry-run", "--budget-s", "540", "--only", "calibrate"]
    assert engine_main(argv) == 0
    assert "budget 540 s" in capsys.readouterr().out


def test_the_parts_run_compiled_kernels_from_the_sources(tmp_path: Path) -> None:
    env, note = command.child_env(tmp_path / "shim")
    assert env["TRITON_INTERPRET"] == "0"
    assert env["PYTHONPATH"].split(os.pathsep)[0 if note == "installed" else 1] == str(
        Path(__file__).resolve().parents[2]
    )


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the run without a GPU, end to end")
def test_a_check_without_a_gpu_reports_every_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "check"
    argv = ["gpu-check", "--out", str(out), "--only", "calibrate,validate-example-chunked"]
    assert engine_main(argv) == 1
    data = json.loads((out / summary.SUMMARY_JSON).read_text())
    parts = {p["name"]: p for p in data["parts"]}
    assert list(parts) == ["environment", "calibrate", "validate-example-chunked"]
    assert parts["environment"]["status"] == "passed"
    assert parts["calibrate"]["status"] == "failed"
    assert "error: device cuda: no CUDA device here" in parts["calibrate"]["reason"]
    assert parts["validate-example-chunked"]["reason"] == (
        "needs calibrate, engine-self to have passed"
    )
    assert data["hardware"] == "H100-SXM (the device matches no preset)"
    assert "calibrate" in capsys.readouterr().out


def test_an_engine_with_graphs_gets_the_pinned_eager_run(tmp_path: Path) -> None:
    eager = {p.name for p in plan(CheckSettings(out=tmp_path))}
    assert "engine-pinned-eager" not in eager
    parts = {p.name: p for p in plan(CheckSettings(out=tmp_path, graphs=True))}
    part = parts["engine-pinned-eager"]
    args = part.commands[0].args
    cores = args[args.index("--cpu-cores") + 1]
    assert "--enforce-eager" in args and cores == pinned_cores(current_cores())
    assert args[args.index("--out") + 1] == str(tmp_path / "engine-pinned-eager" / "run1")
    assert part.after == ("engine-self-eager",) and part.read is not None
    # Last in the plan: the budget drops it first.
    assert list(parts)[-1] == "engine-pinned-eager"


def test_the_pinned_run_takes_two_cores_this_process_may_use() -> None:
    assert pinned_cores(tuple(range(16))) == pinned_cores(None) == "2,3"
    assert pinned_cores((8, 9, 10, 11)) == "9,10"  # a container's cores, past its first
    assert pinned_cores((0, 1)) == "0,1"
    assert pinned_cores((5,)) == "5"
