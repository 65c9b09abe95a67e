"""servesim's decode plan priced (``sim.costmodel.decode_chain``): the split plan the engine
launches (``core.decode_split``, shared with ``kernels.paged_attention`` and
``engine.cuda_graphs``), the longest walk it leaves, and the roofline and a calibrated profile no
faster than that walk."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.decode_split import (
    graph_batch_sizes,
    longest_walk_tiles,
    padded_batch_size,
    plan_splits,
    sequence_split_tokens,
    split_mode_of,
)
from core.model.presets import load_model_spec
from sim.costmodel.base import make_cost_model
from sim.costmodel.config import CostModelConfig
from sim.costmodel.decode_chain import DecodeChain
from sim.costmodel.profile import Table2D
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.step_shape import StepShape
from sim.specs.hardware import get_hardware_preset

A100_PROFILE = Path(__file__).parent / "data" / "llama2_7b_a100_tp1.json"
H200 = get_hardware_preset("H200")
LLAMA = load_model_spec("llama-3-8b")


def _chain(graphs: bool, split_mode: str = "fixed") -> DecodeChain:
    return DecodeChain.for_engine(
        kv_heads=8,
        head_dim=128,
        num_sms=132,
        tile_s=2e-6,
        cuda_graphs=graphs,
        max_num_seqs=256,
        max_model_len=8192,
        split_mode=split_mode,
    )


def test_the_plan_splits_small_batches_into_whole_tiles() -> None:
    # One sequence of 8 KV heads on 264 programs: 33 splits wanted, 2,000 tokens of 64-token
    # tiles (32) allow 32 // 4 = 8; each split 4 tiles long.
    assert plan_splits(8, 2000, 64, 264) == (8, 256)
    # Enough programs: one split, the whole context.
    assert plan_splits(40 * 8, 2000, 64, 264) == (1, 2048)
    assert plan_splits(8, 2000, 64, 264, num_splits=3) == (3, 704)
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        plan_splits(8, 2000, 64, 264, num_splits=0)
    assert longest_walk_tiles(2000, 256, 64) == 4
    assert longest_walk_tiles(100, 256, 64) == 2
    assert longest_walk_tiles(0, 256, 64) == 0
    # Per sequence, 2,000 tokens (32 tiles) over 8 splits walk 4 tiles; 100 tokens, 1.
    assert longest_walk_tiles(2000, 256, 64, num_splits=8, mode="per_sequence") == 4
    assert longest_walk_tiles(100, 256, 64, num_splits=8, mode="per_sequence") == 1
    assert longest_walk_tiles(2000, 1664, 64, num_splits=5, mode="per_sequence") == 7
    with pytest.raises(ValueError, match="mode must be one of"):
        longest_walk_tiles(2000, 256, 64, mode="even")


def test_split_modes_of_recorded_settings() -> None:
    # Runs and profiles recorded before the engine had a split mode ran "fixed".
    assert split_mode_of(None) == split_mode_of({}) == "fixed"
    assert split_mode_of({"decode_split": "per_sequence"}) == "per_sequence"
    with pytest.raises(ValueError, match=r"config\.decode_split must be one of"):
        split_mode_of({"decode_split": "halves"}, "config.decode_split")
    assert sequence_split_tokens(2000, 5, 64) == 448
    assert sequence_split_tokens(0, 5, 64) == 0
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        sequence_split_tokens(10, 0, 64)


def test_the_graph_buckets_are_the_engines() -> None:
    sizes = graph_batch_sizes(256)
    assert sizes[:6] == (1, 2, 4, 8, 16, 24) and sizes[-1] == 256
    assert [padded_batch_size(sizes, n) for n in (1, 3, 5, 9, 17, 256, 257)] == [
        1,
        4,
        8,
        16,
        24,
        256,
        None,
    ]


def test_a_graph_walks_further_than_an_eager_step_of_the_same_batch() -> None:
    eager, graphs = _chain(False), _chain(True)
    # Six decodes, the longest 2,000 tokens. Eager: 48 programs want 6 splits, 32 tiles allow
    # 8 -> 6 splits of 6 tiles. Graph of 8 rows, planned for 8,192 tokens: 64 programs want
    # 5 splits of ceil(128 / 5) = 26 tiles, so the longest context walks 26 tiles.
    assert eager.tiles(6, 2000) == 6
    assert graphs.tiles(6, 2000) == 26
    # A mixed step runs eagerly even where graphs exist; so does a batch above the largest.
    assert graphs.tiles(6, 2000, mixed=True) == 6
    assert graphs.tiles(300, 2000) == eager.tiles(300, 2000) == 32
    assert graphs.layer_s(6, 2000) == pytest.approx(26 * 2e-6)
    assert graphs.tiles(0, 2000) == graphs.tiles(6, 0) == 0
    # Per sequence, the graph's 5 splits share the 2,000 tokens' 32 tiles: 7 each; the eager
    # step's 6 splits, 6 each, as before (its plan was sized for this context already).
    per_seq_eager, per_seq_graphs = _chain(False, "per_sequence"), _chain(True, "per_sequence")
    assert per_seq_graphs.tiles(6, 2000) == 7
    assert per_seq_eager.tiles(6, 2000) == 6
    assert per_seq_graphs.tiles(300, 2000) == 32


def test_bad_chain_parameters_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"DecodeChain\.kv_heads"):
        DecodeChain(0, 64, 264, 1e-6)
    with pytest.raises(ValueError, match=r"DecodeChain\.tile_s"):
        DecodeChain(8, 64, 264, -1e-6)
    with pytest.raises(ValueError, match=r"DecodeChain\.graph_len"):
        DecodeChain(8, 64, 264, 1e-6, graph_sizes=(1, 2))
    with pytest.raises(ValueError, match=r"DecodeChain\.split_mode"):
        DecodeChain(8, 64, 264, 1e-6, split_mode="halves")


def _roofline(engine: str, split: str = "fixed") -> RooflineCostModel:
    config = CostModelConfig(
        async_scheduling=engine == "vllm", engine=engine, max_num_seqs=256, decode_split=split
    )
    return RooflineCostModel(LLAMA, H200, 1, config, block_size=16)


def test_only_servesims_engines_walk() -> None:
    assert _roofline("vllm").decode_chain is None
    assert _roofline("servesim-eager").decode_chain is not None
    cpu = get_hardware_preset("CPU-1T")
    config = CostModelConfig(async_scheduling=False, engine="servesim-eager")
    assert RooflineCostModel(LLAMA, cpu, 1, config, block_size=16).decode_chain is None


def test_servesims_decode_kernel_pays_its_own_fixed_cost() -> None:
    """Where the walk is priced, a decode's fixed cost is ``decode_latency_s`` a layer, not
    the ``attention_latency_s`` of vLLM's kernels, which a vLLM engine keeps."""

    def decode_s(engine: str, latency: float) -> float:
        hw = dataclasses.replace(H200, decode_latency_s=latency)
        config = CostModelConfig(engine=engine)
        roof = RooflineCostModel(LLAMA, hw, 1, config, block_size=16)
        return roof.decode_attention_s(1, 16, 16, max_context=16)

    for engine in ("servesim-eager", "servesim-graphs"):
        assert decode_s(engine, 9e-6) - decode_s(engine, 4e-6) == pytest.approx(32 * 5e-6)
    assert decode_s("vllm", 9e-6) == decode_s("vllm", 4e-6)
    vllm = RooflineCostModel(LLAMA, H200, 1, CostModelConfig(engine="vllm"), block_size=16)
    assert vllm.decode_attention_s(1, 16, 16) > 32 * H200.attention_latency_s


def test_the_walk_floors_a_skewed_graph_decode() -> None:
    graphs = _roofline("servesim-graphs")
    # One 2,000-token context among five short ones: the KV read is small, the walk long.
    skewed = StepShape(decode_context_tokens=(2000, 64, 64, 64, 64, 64))
    walk = graphs.decode_walk_s(6, 2000)
    assert walk == pytest.approx(LLAMA.num_layers * 26 * H200.decode_tile_s)
    attention = graphs.step_breakdown(skewed)["decode_attention"]
    assert attention == pytest.approx(graphs._decode_latency_s + walk)
    # The same batch without the longest context given prices its reads alone.
    reads = graphs.decode_attention_s(6, 2320, 2320)
    assert reads < attention
    # vLLM's engine: no walk.
    assert _roofline("vllm").decode_walk_s(6, 2000) == 0.0
    # The engine's own split today shares each context among the graph's splits: 7 tiles.
    per_seq = _roofline("servesim-graphs", "per_sequence")
    assert per_seq.decode_walk_s(6, 2000) == pytest.approx(
        LLAMA.num_layers * 7 * H200.decode_tile_s
    )
    assert CostModelConfig().decode_split == "per_sequence"


def test_a_walking_roofline_refuses_aggregates() -> None:
    config = CostModelConfig(
        async_scheduling=False,
        engine="servesim-graphs",
        host=CostModelConfig().host_params(),
    )
    model = RooflineCostModel(LLAMA, H200, 1, config, block_size=16)
    assert model.host.simple and model.decode_chain is not None
    assert not model.prices_aggregates
    with pytest.raises(ValueError, match="longest walk"):
        model.decode_step_time_s(4, 4000, 250)


def test_config_checks_the_plans_sizes() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        CostModelConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_model_len"):
        CostModelConfig(max_model_len=0)
    with pytest.raises(ValueError, match=r"CostModelConfig\.decode_split"):
        CostModelConfig(decode_split="halves")


def test_max_model_len_sizes_the_graph_plan() -> None:
    short = RooflineCostModel(
        LLAMA,
        H200,
        1,
        CostModelConfig(async_scheduling=False, engine="servesim-graphs", max_model_len=2048),
        block_size=16,
    )
    assert short.decode_chain is not None and short.decode_chain.graph_len == 2048
    # 8 rows planned for 2,048 tokens: 5 splits of ceil(32 / 5) = 7 tiles.
    assert short.decode_chain.tiles(6, 2000) == 7


def test_a_calibrated_profile_is_no_faster_than_the_walk(tmp_path: Path) -> None:
    """A GPU profile's decode table, timed under the eager plan at uniform contexts, prices a
    graph's skewed batch by its reads; the walk floors it."""
    data = json.loads(A100_PROFILE.read_text())
    table = data["ops"]["decode_attention"]
    table["time_s"] = [[1e-9 for _ in row] for row in table["time_s"]]  # far below any walk
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    a100, llama2 = get_hardware_preset("A100-80GB"), load_model_spec("Llama-2-7B")
    skewed = StepShape(decode_context_tokens=(2000, 64, 64, 64, 64, 64))
    walks = {}
    for engine in ("servesim-graphs", "vllm"):
        config = CostModelConfig(async_scheduling=False, engine=engine, price_padding=False)
        model = make_cost_model(llama2, a100, 1, profile, config, block_size=16)
        roofline = RooflineCostModel(llama2, a100, 1, config, block_size=16)
        walks[engine] = roofline.decode_walk_s(6, 2000)
        attention = model.step_breakdown(skewed)["decode_attention"]
        if engine == "vllm":
            assert walks[engine] == 0.0 and attention < 1e-6
        else:
            assert walks[engine] > 1e-4
            assert attention == pytest.approx(walks[engine])


def test_a_profiles_own_steps_are_priced_under_the_split_they_ran(tmp_path: Path) -> None:
    """The host fit prices a profile's whole steps under the split its engine ran (``engine.
    decode_split``; "fixed" where the profile names none), whatever the run priced now uses."""
    from sim.costmodel.calibrated import own_split_fallback
    from sim.costmodel.profile import load_profile

    a100, llama2 = get_hardware_preset("A100-80GB"), load_model_spec("Llama-2-7B")
    config = CostModelConfig(async_scheduling=False, engine="servesim-graphs")
    fallback = RooflineCostModel(llama2, a100, 1, config, block_size=16)
    assert fallback.config.decode_split == "per_sequence"
    data = {**json.loads(A100_PROFILE.read_text()), "format_version": 2}  # (v2 names an engine)
    for named, expected in ((None, "fixed"), ("per_sequence", "per_sequence"), ("fixed", "fixed")):
        if named is not None:
            data["engine"] = {**data.get("engine", {}), "decode_split": named}
        path = tmp_path / f"profile-{named}.json"
        path.write_text(json.dumps(data))
        own = own_split_fallback(load_profile(path), fallback)
        assert own.config.decode_split == expected
        assert (own is fallback) == (expected == "per_sequence")
        assert own.decode_chain is not None and own.decode_chain.split_mode == expected
    data["engine"]["decode_split"] = "halves"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad\.json: field 'engine\.decode_split'"):
        own_split_fallback(load_profile(path), fallback)
    # vLLM walks no chain: nothing to re-price.
    vllm = RooflineCostModel(llama2, a100, 1, CostModelConfig(), block_size=16)
    assert own_split_fallback(load_profile(tmp_path / "profile-None.json"), vllm) is vllm


H200_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/results/gpu-h200-2026-11-28/call1/calibrate/profile-repeat2.json"
)


def test_a_graph_step_reads_the_decode_table_on_the_graphs_plan() -> None:
    """The H200 calibration of 2026-11-28 (per-sequence split, CUDA graphs, rule ``max``)
    timed its decode table eagerly: each point's splits sized for its own context. A decode
    graph's plan is sized for the model's 8,192 tokens: the tiles it does not walk come off
    the table, and a skewed batch is read at its mean context, its longest context's walk
    the chain's. Eager (mixed) steps keep the table as timed and the profile's rule."""
    from sim.costmodel.calibrated import CalibratedCostModel

    def model(split: str) -> CalibratedCostModel:
        config = CostModelConfig(engine="servesim-graphs", decode_split=split)
        built = make_cost_model(LLAMA, H200, 1, H200_PROFILE, config, block_size=16)
        assert isinstance(built, CalibratedCostModel)
        return built

    per_seq, fixed = model("per_sequence"), model("fixed")
    assert per_seq.profile.decode_attention_context == "max"
    table = per_seq.profile.ops["decode_attention"]
    assert isinstance(table, Table2D)
    assert per_seq.host is not None
    scale, layers, tile_s = per_seq.host.device_scale, LLAMA.num_layers, H200.decode_tile_s

    def decode_s(m: CalibratedCostModel, contexts: tuple[int, ...], chunk: bool = False) -> float:
        chunks = ((64, 0),) if chunk else ()
        shape = StepShape(prefill_chunks=chunks, decode_context_tokens=contexts)
        return m.step_breakdown(shape)["decode_attention"]

    # One 2,048-token context: eager, 8 splits of 4 tiles; the graph's 32 splits, 1 tile each.
    chain = per_seq.fallback.decode_chain
    assert chain is not None
    assert (chain.tiles(1, 2048, mixed=True), chain.tiles(1, 2048)) == (4, 1)
    graph_s = layers * (table(1, 2048) - 3 * tile_s)
    assert decode_s(per_seq, (2048,)) == pytest.approx(scale * graph_s)
    # A step that prefills too runs eagerly: the table as timed.
    assert decode_s(per_seq, (2048,), chunk=True) == pytest.approx(scale * layers * table(1, 2048))
    # Under the fixed split the graph walks the eager plan's 4 tiles: the table as timed.
    assert decode_s(fixed, (2048,)) == pytest.approx(scale * layers * table(1, 2048))
    # 200 tokens: one split of 4 tiles eager, 1 tile in the graph; never below the shortest
    # context's time (one tile, no split).
    assert decode_s(per_seq, (200,)) == pytest.approx(scale * layers * table(1, 16))
    # One 2,000-token context among 23 of 100: the graph reads the table at the mean context
    # (the batch's reads), not at the longest for every sequence; the walk floors it.
    skewed = (2000,) + (100,) * 23
    mean = sum(skewed) / len(skewed)
    # At the mean's 180 tokens (3 tiles) eager, one split; the graph's 24 rows, two: 2 tiles.
    assert (chain.tiles(24, 180, mixed=True), chain.tiles(24, 180)) == (3, 2)
    walk = per_seq.fallback.decode_walk_s(24, 2000)
    expected = max(layers * (table(24, mean) - tile_s), walk)
    assert decode_s(per_seq, skewed) == pytest.approx(scale * expected)
    assert decode_s(per_seq, skewed) < 0.6 * scale * layers * table(24, 2000)
    # The same batch beside a prompt chunk is eager: the profile's rule, at the longest.
    eager_walk = per_seq.fallback.decode_walk_s(24, 2000, mixed=True)
    expected_eager = max(layers * table(24, 2000), eager_walk)
    assert decode_s(per_seq, skewed, chunk=True) == pytest.approx(scale * expected_eager)


def test_a_table_timed_on_the_graphs_plan_is_read_as_it_is(tmp_path: Path) -> None:
    """A profile with ``decode_attention_graph`` (a calibration of the engine with graphs since
    this table exists): a replayed decode step reads it at the batch's mean context, with no
    re-plan; a step beside a prompt chunk, or past the largest graph, reads the eager table."""
    from sim.costmodel.calibrated import CalibratedCostModel

    data = json.loads(H200_PROFILE.read_text())
    eager = data["ops"]["decode_attention"]
    # The graph's own table: the eager one's batch sizes up to 64, each time halved.
    data["ops"]["decode_attention_graph"] = {
        "num_seqs": eager["num_seqs"],
        "context_tokens": eager["context_tokens"],
        "time_s": [[t / 2 for t in row] for row in eager["time_s"]],
    }
    path = tmp_path / "graphs.json"
    path.write_text(json.dumps(data))
    config = CostModelConfig(engine="servesim-graphs", decode_split="per_sequence")
    graphs = make_cost_model(LLAMA, H200, 1, path, config, block_size=16)
    plain = make_cost_model(LLAMA, H200, 1, H200_PROFILE, config, block_size=16)
    assert isinstance(graphs, CalibratedCostModel) and isinstance(plain, CalibratedCostModel)
    table = graphs.profile.ops["decode_attention_graph"]
    assert isinstance(table, Table2D)
    assert graphs.host is not None
    scale, layers = graphs.host.device_scale, LLAMA.num_layers

    def decode_s(m: CalibratedCostModel, contexts: tuple[int, ...], chunk: bool = False) -> float:
        chunks = ((64, 0),) if chunk else ()
        shape = StepShape(prefill_chunks=chunks, decode_context_tokens=contexts)
        return m.step_breakdown(shape)["decode_attention"]

    # Uniform: the graph table at the context, as timed (the walk is in what it timed).
    expected = max(layers * table(4, 1024), graphs.fallback.decode_walk_s(4, 1024))
    assert decode_s(graphs, (1024,) * 4) == pytest.approx(scale * expected)
    # Skewed: at the mean context, floored by the longest context's walk.
    skewed = (2000,) + (100,) * 23
    mean = sum(skewed) / len(skewed)
    expected = max(layers * table(24, mean), graphs.fallback.decode_walk_s(24, 2000))
    assert decode_s(graphs, skewed) == pytest.approx(scale * expected)
    # Eager steps keep the eager table: beside a prompt chunk, and the profile without it.
    assert decode_s(graphs, skewed, chunk=True) == pytest.approx(decode_s(plain, skewed, True))
    assert decode_s(plain, (1024,) * 4) != pytest.approx(decode_s(graphs, (1024,) * 4))


def test_only_a_version_5_profile_may_carry_the_graphs_table(tmp_path: Path) -> None:
    from sim.costmodel.profile import load_profile

    data = {**json.loads(A100_PROFILE.read_text()), "format_version": 4}
    data["ops"]["decode_attention_graph"] = data["ops"]["decode_attention"]
    path = tmp_path / "v4.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"field 'ops\.decode_attention_graph': unknown op"):
        load_profile(path)
