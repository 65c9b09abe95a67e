"""The engine's CUDA-only set-up (``engine.cuda_setup``), the part a CPU can check: which
configurations capture graphs; what the graphs are built from; that the graph-memory
measurement captures on a one-block scratch cache and releases it (and its graphs) before
returning the memory; that the graphs are handed to the runner with their costs summed; and the
KV cache's size from the profiling pass's peak, the graphs and ``gpu_memory_utilization``,
with its refusals. Fakes stand in for the graphs and the CUDA calls; the real capture is
tests/engine/test_gpu_graphs.py's, on a GPU."""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from core.config import GIB, CacheConfig, SchedulerConfig  # noqa: E402
from engine import cuda_setup  # noqa: E402
from engine.cuda_graphs import GraphStats, graph_batch_sizes  # noqa: E402
from engine.cuda_setup import (  # noqa: E402
    capture_graphs,
    gpu_blocks,
    graph_memory,
    uses_graphs,
)
from engine.llm_engine import EngineConfig  # noqa: E402
from engine.memory import profile_batch  # noqa: E402
from engine.mixed_graphs import mixed_token_sizes  # noqa: E402
from engine.model.weights import load_model  # noqa: E402

CUDA = torch.device("cuda")


def test_graph_memory_measured_negative_is_refused_before_any_cuda_call() -> None:
    # A second calibration once measured its graphs at -109 GiB (memory a dropped engine held
    # was freed as they were captured) and asked for a 219 GiB cache on a 140 GiB H200.
    with pytest.raises(ValueError, match=r"CUDA graphs measured at -109.0 GiB"):
        gpu_blocks(None, None, 1 << 20, -109 * (1 << 30))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "device", "expected"),
    [
        ({"device": "cuda"}, CUDA, True),
        ({"device": "cuda", "backend": "triton"}, CUDA, True),
        ({"device": "cuda", "enforce_eager": True}, CUDA, False),
        ({"device": "cuda", "backend": "torch"}, CUDA, False),
        ({"device": "cpu"}, torch.device("cpu"), False),
    ],
)
def test_graphs_are_captured_on_cuda_with_the_triton_kernels_unless_eager(
    settings: dict[str, Any], device: torch.device, expected: bool
) -> None:
    assert uses_graphs(EngineConfig(**settings), device) is expected


class _FakeGraphs:
    """A graph set that records what it was built from (weakly: what it holds must die with
    it) and reports a capture of ``bytes_each`` a graph."""

    bytes_each = 1000

    def __init__(self, log: list[dict[str, Any]], kind: str, cache: torch.Tensor, sizes: Any):
        self.sizes = tuple(sizes)
        self.num_pieces = 3
        self.entry: dict[str, Any] = {
            "kind": kind,
            "cache": weakref.ref(cache),
            "sizes": self.sizes,
        }
        self.entry["graphs"] = weakref.ref(self)
        log.append(self.entry)

    def capture(self) -> GraphStats:
        self.entry["captured"] = self.entry.get("captured", 0) + 1
        num_graphs = len(self.sizes) * (self.num_pieces if self.entry["kind"] == "mixed" else 1)
        return GraphStats(num_graphs, 0.25, num_graphs * self.bytes_each)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Fake decode and piecewise graphs and a fake ``empty_cache`` that notes, each time it is
    called, which graph sets and caches were still alive."""
    log: dict[str, list[Any]] = {"graphs": [], "empty_cache": []}

    def decode(
        model: Any, kv_cache: Any, buffers: Any, sizes: Any, max_len: int, *a: Any, **kw: Any
    ) -> _FakeGraphs:
        graphs = _FakeGraphs(log["graphs"], "decode", kv_cache.kv, sizes)
        graphs.entry.update(max_len=max_len, buffers=buffers, args=a, kwargs=kw)
        return graphs

    def mixed(model: Any, layers: Any, sizes: Any, *a: Any, **kw: Any) -> _FakeGraphs:
        graphs = _FakeGraphs(log["graphs"], "mixed", layers[0][0], sizes)
        graphs.entry.update(args=a, kwargs=kw)
        return graphs

    def empty_cache() -> None:
        alive = [e["kind"] for e in log["graphs"] if e["graphs"]() is not None]
        caches = [e["kind"] for e in log["graphs"] if e["cache"]() is not None]
        log["empty_cache"].append({"graphs_alive": alive, "caches_alive": caches})

    monkeypatch.setattr(cuda_setup, "DecodeGraphs", decode)
    monkeypatch.setattr(cuda_setup, "MixedGraphs", mixed)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    return log


@pytest.fixture(scope="module")
def model() -> Any:
    return load_model("tiny-llama", device="cpu", weights="random", seed=0)


def _config(mixed: str = "off", **scheduler: Any) -> Any:
    """The fields the set-up reads; EngineConfig itself refuses piecewise graphs off CUDA."""
    return SimpleNamespace(
        cache=CacheConfig(block_size=16, gpu_memory_utilization=0.9),
        scheduler=SchedulerConfig(policy="chunked", **scheduler),
        decode_split="fixed",
        mixed_graphs=mixed,
        backend="auto",
    )


@pytest.mark.parametrize("mixed", ["off", "piecewise"])
def test_graph_memory_is_measured_on_a_one_block_scratch_that_is_gone_before_empty_cache(
    fakes: dict[str, list[Any]], model: Any, mixed: str
) -> None:
    config = _config(mixed, max_num_seqs=24, max_num_batched_tokens=300)
    measured = graph_memory(model, config, torch.float32, max_len=100)

    decode_sizes = graph_batch_sizes(24)
    entries = fakes["graphs"]
    assert [e["kind"] for e in entries] == (["decode", "mixed"] if mixed != "off" else ["decode"])
    decode = entries[0]
    assert decode["sizes"] == decode_sizes and decode["max_len"] == 100
    assert decode["kwargs"] == {"replay": True, "decode_split": "fixed"}
    expected = len(decode_sizes) * _FakeGraphs.bytes_each
    if mixed != "off":
        assert entries[1]["sizes"] == mixed_token_sizes(300)
        assert entries[1]["kwargs"] == {"replay": True}
        expected += len(mixed_token_sizes(300)) * 3 * _FakeGraphs.bytes_each
    assert all(e["captured"] == 1 for e in entries)
    assert measured == expected
    assert all(e["cache"]() is None for e in entries), "the scratch cache outlived graph_memory"
    # empty_cache ran once, after the scratch cache and every graph set on it were released.
    assert fakes["empty_cache"] == [{"graphs_alive": [], "caches_alive": []}]


def test_graph_memory_scratch_has_one_block_of_the_models_shape(
    monkeypatch: pytest.MonkeyPatch, fakes: dict[str, list[Any]], model: Any
) -> None:
    shapes = []
    real_allocate = cuda_setup.KVCache.allocate

    def allocate(*args: Any, **kwargs: Any) -> Any:
        cache = real_allocate(*args, **kwargs)
        shapes.append((tuple(cache.kv.shape), cache.kv.dtype, cache.kv.device.type))
        return cache

    monkeypatch.setattr(cuda_setup.KVCache, "allocate", allocate)
    graph_memory(model, _config(), torch.float16, max_len=100)
    cfg = model.config
    assert shapes == [
        ((2, cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim), torch.float16, "cpu")
    ]


@pytest.mark.parametrize("mixed", ["off", "piecewise"])
def test_captured_graphs_go_to_the_runner_with_their_costs_summed(
    fakes: dict[str, list[Any]],
    model: Any,
    mixed: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = cuda_setup.KVCache.allocate(
        model.config.num_layers, 4, 16, model.config.num_kv_heads, model.config.head_dim,
        torch.float32, "cpu",
    )  # fmt: skip
    runner = SimpleNamespace(kv_cache=cache, buffers=object(), graphs=None, mixed_graphs=None)
    config = _config(mixed, max_num_seqs=8, max_num_batched_tokens=64)
    stats = capture_graphs(model, config, runner, max_len=64)  # type: ignore[arg-type]

    num_decode = len(graph_batch_sizes(8))
    num_pieces = len(mixed_token_sizes(64)) * 3 if mixed != "off" else 0
    assert stats.num_graphs == num_decode + num_pieces
    assert stats.memory_bytes == (num_decode + num_pieces) * _FakeGraphs.bytes_each
    assert stats.capture_s == pytest.approx(0.5 if mixed != "off" else 0.25)
    assert runner.graphs is not None and runner.graphs.entry["kind"] == "decode"
    assert runner.graphs.entry["buffers"] is runner.buffers
    assert runner.graphs.entry["cache"]() is cache.kv
    if mixed == "off":
        assert runner.mixed_graphs is None
    else:
        assert runner.mixed_graphs.entry["kind"] == "mixed"
        assert runner.mixed_graphs.entry["cache"]() is cache.layers[0][0]
    err = capsys.readouterr().err
    assert f"captured {num_decode} CUDA graphs for decode batches of 1..8" in err
    assert ("piecewise CUDA graphs" in err) is (mixed != "off")
    assert fakes["empty_cache"] == []  # (the real cache is kept: nothing to return)


class _FakeCuda:
    """torch.cuda's memory calls, as a device of ``total`` bytes whose profiling pass peaks
    at ``peak``; ``calls`` keeps their order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, total: int, peak: int) -> None:
        self.calls: list[str] = []
        self.lens: list[Any] = []
        self.peak = peak
        props = SimpleNamespace(total_memory=total)
        for name in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
            monkeypatch.setattr(torch.cuda, name, self._note(name))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", self._max_allocated)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
        monkeypatch.setattr(cuda_setup, "run_profiling_pass", self._profile)

    def _note(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append(name)

    def _max_allocated(self, device: Any) -> int:
        self.calls.append("max_memory_allocated")
        return self.peak

    def _profile(self, model: Any, lens: Any, block_size: int, backend: str) -> None:
        self.calls.append("profiling_pass")
        self.lens.append((lens, block_size, backend))


def test_the_kv_cache_gets_the_utilisation_less_the_peak_and_the_graphs(
    monkeypatch: pytest.MonkeyPatch, model: Any
) -> None:
    cuda = _FakeCuda(monkeypatch, total=100 * GIB, peak=10 * GIB)
    config = _config(max_num_seqs=16, max_num_batched_tokens=512)
    block_bytes = 2 * 1024 * 1024
    blocks = gpu_blocks(model, config, block_bytes, reserved_bytes=5 * GIB)
    assert blocks == int((0.9 * 100 * GIB - 10 * GIB - 5 * GIB) // block_bytes) == 38400
    # The peak is reset before the pass and read after it (and after the GPU has finished).
    order = cuda.calls
    assert order.index("reset_peak_memory_stats") < order.index("profiling_pass")
    assert order.index("profiling_pass") < order.index("synchronize")
    assert order.index("synchronize") < order.index("max_memory_allocated")
    # The pass is the largest step the scheduler can make at the model's length.
    expected = profile_batch(512, 16, model.config.max_model_len)
    assert cuda.lens == [(expected, 16, "auto")]


def test_no_room_for_a_kv_cache_is_refused_with_the_figures(
    monkeypatch: pytest.MonkeyPatch, model: Any
) -> None:
    _FakeCuda(monkeypatch, total=100 * GIB, peak=80 * GIB)
    with pytest.raises(ValueError, match=r"no room for a KV cache: peak 80.0 GiB and CUDA "
                       r"graphs 12.0 GiB of 100.0 GiB at gpu_memory_utilization 0.9"):  # fmt: skip
        gpu_blocks(model, _config(), 1 << 20, reserved_bytes=12 * GIB)
