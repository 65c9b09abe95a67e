"""The engine's memory before it allocates: the profiling pass's batch never exceeds the model's
length (issue 29's second calibration defect: one sequence of the whole token budget read the
rotary table past its end), the estimate of weights + cache + activations, and the refusal
with an ``error:`` line when it exceeds a (fake) memory limit, before anything is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import engine.llm_engine as llm_engine  # noqa: E402
from engine import memory  # noqa: E402
from engine.cli import main as engine_main  # noqa: E402
from engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from engine.model.llama import LlamaForCausalLM  # noqa: E402
from engine.model.support import engine_model_spec  # noqa: E402
from engine.model.weights import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


@given(
    budget=st.integers(1, 20_000),
    max_num_seqs=st.integers(1, 600),
    max_model_len=st.integers(1, 9000),
)
def test_the_profiling_batch_fits_the_model_and_the_budgets(
    budget: int, max_num_seqs: int, max_model_len: int
) -> None:
    lens = memory.profile_batch(budget, max_num_seqs, max_model_len)
    assert lens and all(1 <= n <= max_model_len for n in lens)
    assert len(lens) <= max_num_seqs
    # The largest step the scheduler can form: the whole budget, unless the sequences cannot
    # hold it; as many sequences as the budget allows (the most logit rows a step samples).
    assert sum(lens) == min(budget, max_num_seqs * max_model_len)
    assert len(lens) == min(sum(lens), max_num_seqs)
    assert max(lens) - min(lens) <= 1


def test_the_default_budget_on_a_shorter_model_is_split() -> None:
    # tiny-llama's 4096 positions under the default 8192-token budget: the case that stopped
    # CUDA on a device-side assert when the pass was one sequence of 8192 positions.
    assert memory.profile_batch(8192, 1, 4096) == (4096,)
    assert memory.profile_batch(8192, 2, 4096) == (4096, 4096)
    assert memory.profile_batch(8192, 256, 2048) == (32,) * 256


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    return load_model("tiny-llama", weights="random")


def test_the_profiling_pass_runs_within_the_rotary_table(tiny: LlamaForCausalLM) -> None:
    max_len = tiny.config.max_model_len
    lens = memory.profile_batch(2 * max_len, 1, max_len)
    memory.run_profiling_pass(tiny, lens, block_size=16, backend="torch")
    # The old shape (one sequence of the whole budget) reads past the table: on CPU an
    # IndexError, so this test sees what CUDA reported as a device-side assert.
    with pytest.raises(IndexError):
        memory.run_profiling_pass(tiny, (2 * max_len,), block_size=16, backend="torch")


def test_the_parameter_count_is_the_models() -> None:
    for name in ("tiny-llama", "llama-3-8b"):
        config = engine_model_spec(name)
        model = LlamaForCausalLM(config, torch.device("meta"), torch.float32)
        assert memory.num_parameters(config) == sum(p.numel() for p in model.parameters())


def test_the_estimate_adds_weights_cache_and_activations() -> None:
    config = EngineConfig(model="llama-3-8b", weights="random", max_num_batched_tokens=512)
    model = engine_model_spec("llama-3-8b")
    need = memory.estimate_memory(config, model, 4, model.max_model_len)
    assert need.weights_bytes > 8_030_261_248 * 4  # fp32 parameters and the rotary tables
    assert need.kv_cache_bytes <= GIB  # cpu_kv_cache_gib's whole blocks
    assert need.swap_bytes == 0  # recompute: no host swap space
    smaller = memory.estimate_memory(
        EngineConfig(model="llama-3-8b", max_num_batched_tokens=256), model, 4, 8192
    )
    assert 0 < smaller.activation_bytes < need.activation_bytes


def _limits(tmp_path: Path, limit: str, usage: int) -> tuple[Path, Path]:
    tmp_path.mkdir(exist_ok=True)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       67108864 kB\nMemAvailable:   62914560 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(limit + "\n")
    (cgroup / "memory.current").write_text(f"{usage}\n")
    return meminfo, cgroup


def test_available_memory_is_the_least_of_meminfo_and_the_cgroup(tmp_path: Path) -> None:
    meminfo, cgroup = _limits(tmp_path, str(2 * GIB), GIB // 2)
    assert memory.available_host_bytes(meminfo, cgroup) == (3 * GIB // 2, "cgroup limit 2.0 GiB")
    meminfo, cgroup = _limits(tmp_path / "unlimited", "max", GIB)
    assert memory.available_host_bytes(meminfo, cgroup) == (60 * GIB, "MemAvailable")
    missing = tmp_path / "nowhere"
    assert memory.available_host_bytes(missing, missing) == (None, "unknown")


def test_an_engine_too_big_for_the_host_is_refused_before_allocating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case: Llama-3-8B with random weights on a 24 GiB machine was killed after
    # 68 s with no message. Here the 24 GiB is a fake cgroup limit, 1 GiB of it in use.
    meminfo, cgroup = _limits(tmp_path, str(24 * GIB), GIB)
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "CGROUP_ROOT", cgroup)

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was allocated before the memory check")

    monkeypatch.setattr(llm_engine, "load_model", no_load)
    trace = ROOT / "traces" / "data" / "example.csv"
    argv = ["run", str(trace), "--model", "Llama-3-8B", "--weights", "random", "--quiet"]
    assert engine_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model Llama-3-8B (float32) needs about 33.")
    assert "weights 29.9 GiB" in err and "23.0 GiB is available (cgroup limit 24.0 GiB)" in err
    assert "Traceback" not in err


def test_the_estimate_is_what_the_engine_allocates() -> None:
    engine = LLMEngine(EngineConfig(weights="random", cpu_kv_cache_gib=0.01))
    need = memory.check_memory(engine.config)
    model = engine.model
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert need.weights_bytes == weights
    cache = sum(k.numel() * k.element_size() * 2 for k, _ in engine.kv_cache.layers)
    assert need.kv_cache_bytes == cache


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_without_a_device_is_an_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    trace = ROOT / "traces" / "data" / "example.csv"
    assert engine_main(["run", str(trace), "--device", "cuda", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device cuda: no CUDA device here (torch ")
