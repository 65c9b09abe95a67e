"""The engine end to end on CPU: greedy outputs equal Hugging Face ``generate`` under every
policy, with prefix caching, with preemption (swap and recompute) forced by a tiny cache and with
``n > 1``; sampling does not depend on batch composition; a trace replay writes run records the
report loader reads beside a simulated run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.cli import main as engine_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NUM_PROMPTS = 16
MAX_TOKENS = 12


def _tiny_llama_dir(path: Path) -> Path:
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        # Larger weights than the default 0.02 spread the logits, so greedy picks are not ties.
        initializer_range=0.2,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    lengths = [3 + 7 * i for i in range(NUM_PROMPTS)]  # 3 .. 108 tokens
    shared = torch.randint(3, 512, (40,), generator=gen).tolist()
    out = []
    for i, length in enumerate(lengths):
        own = torch.randint(3, 512, (length,), generator=gen).tolist()
        # Every other prompt opens with the same 40 tokens, so prefix caching has real hits.
        out.append((shared + own)[:length] if i % 2 else own)
    return out


@pytest.fixture(scope="module")
def expected(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                pad_token_id=0,
            )
            out.append(generated[0, len(prompt) :].tolist())
    return out


def _generate(model_dir: Path, prompts: list[list[int]], **kwargs: object) -> LLM:
    return LLM(model=str(model_dir), device="cpu", **kwargs)  # type: ignore[arg-type]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

CASES = {
    "continuous": dict(policy="continuous"),
    "chunked": dict(policy="chunked", max_num_seqs=32, max_num_batched_tokens=32),
    "static": dict(policy="static", batch_size=5),
    "dynamic": dict(policy="dynamic", batch_size=4, max_wait_s=0.0),
    "chunked-prefix-caching": dict(
        policy="chunked", max_num_seqs=48, max_num_batched_tokens=48, enable_prefix_caching=True
    ),
    "recompute-tiny-cache": dict(
        policy="chunked", max_num_seqs=64, max_num_batched_tokens=64, num_blocks=40
    ),
    "swap-tiny-cache": dict(
        policy="continuous", num_blocks=40, preemption_mode="swap", swap_space_gib=0.01
    ),
    "prefix-caching-tiny-cache": dict(
        policy="chunked",
        max_num_seqs=32,
        max_num_batched_tokens=32,
        num_blocks=40,
        enable_prefix_caching=True,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_outputs_equal_transformers(
    case: str, model_dir: Path, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    llm = _generate(model_dir, prompts, block_size=4, **CASES[case])
    outputs = llm.generate(prompts, GREEDY)
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == expected
    if "tiny-cache" in case:
        assert sum(o.num_preemptions for o in outputs) > 0, "the tiny cache forced no preemption"
    if "prefix-caching" in case:
        assert sum(o.num_prefix_hit_tokens for o in outputs) > 0, "no prefix-cache hit"


@pytest.mark.parametrize("parallel_sampling", ["fan_out", "fork"])
def test_parallel_samples_fan_out_or_fork_with_copy_on_write(
    model_dir: Path, prompts: list[list[int]], expected: list[list[int]], parallel_sampling: str
) -> None:
    llm = _generate(
        model_dir,
        prompts,
        block_size=4,
        policy="chunked",
        max_num_seqs=40,
        max_num_batched_tokens=40,
        parallel_sampling=parallel_sampling,
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=3)
    outputs = llm.generate(prompts[:6], params)
    for output, want in zip(outputs, expected[:6], strict=True):
        assert [s.token_ids for s in output.outputs] == [want] * 3


def test_fanned_out_children_sample_as_requests_of_seed_plus_index(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """vLLM v1 gives child i of a seeded request the seed + i: it samples what a lone request
    of that seed samples."""
    sampled = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, n=2, seed=7)
    llm = _generate(model_dir, prompts, block_size=4, policy="chunked")
    pair = llm.generate([prompts[2]], sampled)[0].outputs
    for index in range(2):
        alone = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, seed=7 + index)
        single = _generate(model_dir, prompts, block_size=4).generate([prompts[2]], alone)
        assert pair[index].token_ids == single[0].outputs[0].token_ids
    assert pair[0].token_ids != pair[1].token_ids


def test_parallel_samples_under_preemption(
    model_dir: Path, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    llm = _generate(
        model_dir,
        prompts,
        block_size=4,
        policy="chunked",
        max_num_seqs=32,
        max_num_batched_tokens=32,
        num_blocks=40,
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=2)
    outputs = llm.generate(prompts[6:12], params)
    assert sum(o.num_preemptions for o in outputs) > 0
    for output, want in zip(outputs, expected[6:12], strict=True):
        assert [s.token_ids for s in output.outputs] == [want] * 2


@pytest.mark.parametrize("case", ["continuous", "swap-tiny-cache"])
def test_decodes_on_padded_graph_buckets_equal_transformers(
    case: str, model_dir: Path, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """Every decode-only step through a CUDA graph's padded bucket, run eagerly (no GPU): the
    greedy tokens, with n > 1 too, are still ``transformers``'."""
    from engine.cuda_graphs import DecodeGraphs, graph_batch_sizes

    llm = _generate(model_dir, prompts, block_size=4, max_num_seqs=24, **CASES[case])
    engine, runner = llm.engine, llm.engine.runner
    graphs = DecodeGraphs(
        engine.model, engine.kv_cache, runner.buffers, graph_batch_sizes(24),
        engine.cache_config.max_model_len, runner.backend, replay=False,
    )  # fmt: skip
    sizes: list[int] = []
    run = graphs.run
    graphs.run = lambda host, size: sizes.append(size) or run(host, size)  # type: ignore[method-assign]
    runner.graphs = graphs
    # Requests end at different steps, so the decode batches shrink through the buckets.
    lengths = [1 + i % MAX_TOKENS for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == [
        want[:n] for want, n in zip(expected, lengths, strict=True)
    ]
    assert len(set(sizes)) >= 3, f"decode steps took only the buckets {sorted(set(sizes))}"
    parallel = llm.generate(
        prompts[:4], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=3)
    )
    assert [[s.token_ids for s in o.outputs] for o in parallel] == [[w] * 3 for w in expected[:4]]
    assert runner.tables.num_sequences == 0, "finished sequences keep no table row"


def test_sampling_does_not_depend_on_the_batch(model_dir: Path, prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    alone = _generate(model_dir, prompts, block_size=4).generate([prompts[5]], params)
    llm = _generate(
        model_dir,
        prompts,
        block_size=4,
        policy="chunked",
        max_num_seqs=24,
        max_num_batched_tokens=24,
    )
    together = llm.generate(
        prompts[:8],
        [SamplingParams(max_tokens=5, temperature=1.0)] * 5
        + [params]
        + [SamplingParams(max_tokens=9)] * 2,
    )
    assert alone[0].outputs[0].token_ids == together[5].outputs[0].token_ids
    other_seed = _generate(model_dir, prompts, block_size=4).generate(
        [prompts[5]], SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=8)
    )
    assert other_seed[0].outputs[0].token_ids != alone[0].outputs[0].token_ids


def test_a_prompt_longer_than_the_model_allows_is_refused(model_dir: Path) -> None:
    llm = _generate(model_dir, [], block_size=4)
    with pytest.raises(ValueError, match="max length 512"):
        llm.generate([[5] * 600], GREEDY)


def test_triton_backend_end_to_end_under_the_interpreter(model_dir: Path, tmp_path: Path) -> None:
    """The kernels' Triton path (TRITON_INTERPRET=1) gives the torch path's greedy tokens."""
    code = (
        "import json, sys\n"
        "from engine import LLM, SamplingParams\n"
        "prompts = [[5, 9, 13, 200, 7], list(range(3, 40)), [11] * 9]\n"
        "out = {}\n"
        "for backend in ('triton', 'torch'):\n"
        "    llm = LLM(model=sys.argv[1], block_size=16, policy='chunked',\n"
        "              max_num_seqs=24, max_num_batched_tokens=24, backend=backend)\n"
        "    res = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))\n"
        "    out[backend] = [r.outputs[0].token_ids for r in res]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(model_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["triton"] == out["torch"]


def test_trace_replay_writes_records_the_report_reads(tmp_path: Path) -> None:
    from records.run_dir import load_run

    trace = tmp_path / "trace.csv"
    rows = ["request_id,arrival_s,prompt_tokens,output_tokens,num_samples"]
    rows += [f"r{i},{0.01 * i:.3f},{20 + 9 * i},{4 + i % 5},{1 + (i % 4 == 3)}" for i in range(12)]
    rows.append("huge,0.2,5000,4,1")  # longer than tiny-llama allows: rejected with a reason
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "engine-run"
    code = engine_main(
        [
            "run",
            str(trace),
            "--model",
            "tiny-llama",
            "--weights",
            "random",
            "--policy",
            "chunked",
            "--max-num-seqs",
            "64",
            "--max-batch-tokens",
            "64",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    run = load_run(out)
    frame = run.requests
    assert len(frame) == 13
    finished = frame[frame.status == "finished"]
    assert len(finished) == 12
    huge = frame[frame.request_id == "huge"].iloc[0]
    assert huge.status == "rejected" and "max length" in huge.reject_reason
    assert (finished.output_tokens == [4 + i % 5 for i in range(12)]).all()
    assert run.steps["duration_s"].gt(0).all()
    assert run.summary["completed"] == 12

    from sim.cli.main import main as sim_main

    sim_out = tmp_path / "sim-run"
    assert (
        sim_main(["run", str(trace), "--model", "tiny-llama", "--out", str(sim_out), "--quiet"])
        == 0
    )
    report = tmp_path / "both.html"
    from reports.cli import main as report_main

    assert report_main([str(out), str(sim_out), "-o", str(report)]) == 0
    assert report.stat().st_size > 0


def test_engine_cli_errors_name_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    trace = ROOT / "traces" / "data" / "example.csv"
    code = engine_main(["run", str(trace), "--model", str(config.parent), "--quiet"])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_engine_run_names_an_option_it_never_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens\nr0,0.0,12,2\n")
    argv = ["run", str(trace), "--model", "tiny-llama", "--weights", "random", "--quiet"]
    assert engine_main([*argv, "--policy", "chunked", "--max-wait-s", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "note: --max-wait-s: applies to dynamic batching, not chunked; it has no effect" in err
    assert engine_main([*argv, "--policy", "dynamic", "--max-wait-s", "0.5"]) == 0
    assert "note:" not in capsys.readouterr().err
    # The CPU runs the torch kernels, which have no KV splits.
    assert engine_main([*argv, "--decode-split", "fixed"]) == 0
    assert "note: --decode-split: the Triton decode kernel's" in capsys.readouterr().err


def test_generation_stops_at_the_models_eos(
    model_dir: Path, prompts: list[list[int]], expected: list[list[int]], tmp_path: Path
) -> None:
    import shutil

    stop_dir = tmp_path / "eos"
    shutil.copytree(model_dir, stop_dir)
    config = json.loads((stop_dir / "config.json").read_text())
    eos = expected[0][3]  # greedy's 4th token for prompt 0 becomes end-of-sequence
    config["eos_token_id"] = [eos, 999_999]
    (stop_dir / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(stop_dir), block_size=4)
    stopped, ignored = llm.generate(
        [prompts[0], prompts[0]], [SamplingParams(max_tokens=MAX_TOKENS), GREEDY]
    )
    first = expected[0].index(eos)
    assert stopped.outputs[0].token_ids == expected[0][: first + 1]
    assert stopped.outputs[0].finish_reason == "stop"
    assert ignored.outputs[0].token_ids == expected[0]
    assert ignored.outputs[0].finish_reason == "length"


def test_replayed_shared_prefixes_are_real_cache_hits(tmp_path: Path) -> None:
    """Prefix hash ids become the same token ids in every request naming them, so the engine's
    prefix cache hits on them, and only on them."""
    from records.run_dir import load_run

    trace = tmp_path / "prefix.csv"
    trace.write_text(
        "request_id,arrival_s,prompt_tokens,output_tokens,num_samples,prefix_hash_ids,"
        "hash_block_tokens\n"
        "a,0.0,70,3,1,7 8 9 10,16\n"
        "b,0.0,80,3,1,7 8 9 10,16\n"
        "c,0.0,50,3,1,7 8 11,16\n"
        "d,0.0,60,3,1,20 21,16\n"
    )
    out = tmp_path / "run"
    args = [
        "run",
        str(trace),
        "--weights",
        "random",
        "--prefix-caching",
        "--policy",
        "continuous",
        "--max-num-seqs",
        "1",
        "--time-scale",
        "0",
        "--out",
        str(out),
        "--quiet",
    ]
    assert engine_main(args) == 0
    hits = load_run(out).requests.set_index("request_id")["num_prefix_hit_tokens"].to_dict()
    # b shares a's 4 hashed blocks (64 tokens); c shares the first two; d shares nothing.
    assert hits == {"a": 0, "b": 64, "c": 32, "d": 0}


@pytest.mark.parametrize(
    "option",
    [
        "--time-scale",
        "--temperature",
        "--max-wait-s",
        "--swap-space-gib",
        "--slo-ttft",
        "--gpu-memory-utilization",
        "--max-num-batched-tokens",
        "--max-batch-tokens",  # the old spelling, named beside the new one
        "--num-blocks",
        "--cpu-threads",
    ],
)
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_engine_numeric_options_refuse_nonsense(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = ROOT / "traces" / "data" / "example.csv"
    with pytest.raises(SystemExit) as exit_info:
        engine_main(["run", str(trace), option, value, "--quiet"])
    assert exit_info.value.code == 2
    line = next(line for line in capsys.readouterr().err.splitlines() if "error:" in line)
    assert "error: argument --" in line and option in line


def test_swap_without_swap_space_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    trace = ROOT / "traces" / "data" / "example.csv"
    code = engine_main(["run", str(trace), "--preemption", "swap", "--swap-space-gib", "0"])
    assert code == 2
    assert "swap_space_gib" in capsys.readouterr().err


def test_the_weights_hint_speaks_the_command_lines_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = ROOT / "traces" / "data" / "example.csv"
    assert engine_main(["run", str(trace), "--model", "tiny-llama", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--weights random" in err


def test_an_engine_runs_report_names_its_device_dtype_and_measured_times(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("request_id,arrival_s,prompt_tokens,output_tokens\na,0,12,3\nb,0.01,9,2\n")
    out, report = tmp_path / "run", tmp_path / "r.html"
    argv = ["run", str(trace), "--weights", "random", "--clock", "cpu", "--quiet"]
    assert engine_main([*argv, "--out", str(out), "--report", str(report)]) == 0
    assert json.loads((out / "summary.json").read_text())["dtype"] == "float32"
    page = report.read_text()
    runs = page.split('id="runs"')[2].split("</table>")[0]
    assert "TPunknown" not in runs and "<td>tiny-llama</td>" in runs
    assert "<td>cpu, float32</td>" in runs
    assert "measured: the real engine&#x27;s steps, on thread-CPU time" in runs
    assert "roofline" not in runs and "unknown router" not in runs
