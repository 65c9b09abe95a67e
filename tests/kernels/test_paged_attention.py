"""Decode attention: the Triton kernel against the torch reference and against torch SDPA on
the K/V before they were paged, with NaN in every slot a sequence does not own."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels.paged_attention import (  # noqa: E402
    choose_num_splits,
    paged_decode_attention,
)
from kernels.reference import paged_decode_attention_ref  # noqa: E402
from tests.kernels.paged_cases import (  # noqa: E402
    assert_close,
    make_paged_case,
    random_queries,
    sdpa_attention,
)

# 1 token, partial blocks, and exact multiples of every block size used below.
SEQ_LENS = [1, 5, 16, 33, 64]


def run_decode(case, group: int, dtype, device, **kwargs):
    num_kv_heads, head_dim = case.k_cache.shape[2], case.k_cache.shape[3]
    q = random_queries(len(case.keys), num_kv_heads * group, head_dim, dtype, device)
    scale = 1 / math.sqrt(head_dim)
    out = paged_decode_attention(
        q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.seq_lens,
        scale,
        backend="triton",
        **kwargs,
    )
    return q, scale, out


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_decode_matches_reference_and_sdpa(device, group, dtype, block_size):
    dtype = getattr(torch, dtype)
    case = make_paged_case(
        SEQ_LENS, block_size=block_size, num_kv_heads=2, head_dim=32, dtype=dtype, device=device
    )
    q, scale, out = run_decode(case, group, dtype, device, tile_tokens=16)
    ref = paged_decode_attention_ref(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale
    )
    assert_close(out, ref, dtype)
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        expected = sdpa_attention(q[seq_idx : seq_idx + 1], k, v, scale)[0]
        assert_close(out[seq_idx], expected, dtype)


@pytest.mark.parametrize("split_mode", ["per_sequence", "fixed"])
@pytest.mark.parametrize(
    ("num_splits", "max_seq_len"), [(1, None), (2, None), (3, None), (7, None), (3, 64)]
)
def test_split_kv_matches_single_pass(device, num_splits, max_seq_len, split_mode):
    # 7 splits of a 64-token maximum leave empty splits for the short sequences (in both
    # modes: per sequence, a 5-token context has one tile for 7 splits).
    case = make_paged_case(
        SEQ_LENS, block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=device
    )
    q, scale, out = run_decode(
        case,
        4,
        torch.float32,
        device,
        num_splits=num_splits,
        tile_tokens=16,
        max_seq_len=max_seq_len,
        split_mode=split_mode,
    )
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        assert_close(
            out[seq_idx], sdpa_attention(q[seq_idx : seq_idx + 1], k, v, scale)[0], torch.float32
        )


def test_head_dim_64_mqa_and_default_heuristics(device):
    # MQA (16 query heads on 1 kv head) with default tile and split choices.
    case = make_paged_case(
        [3, 40, 100], block_size=32, num_kv_heads=1, head_dim=64, dtype=torch.float16, device=device
    )
    q, scale, out = run_decode(case, 16, torch.float16, device)
    for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
        assert_close(
            out[seq_idx], sdpa_attention(q[seq_idx : seq_idx + 1], k, v, scale)[0], torch.float16
        )


@pytest.mark.parametrize("split_mode", ["per_sequence", "fixed"])
def test_empty_sequence_gives_zeros_not_nan(device, split_mode):
    case = make_paged_case(
        [0, 9], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=device
    )
    for num_splits in (1, 2):
        _, _, out = run_decode(
            case, 1, torch.float32, device, num_splits=num_splits, split_mode=split_mode
        )
        assert torch.count_nonzero(out[0]) == 0
        assert not torch.isnan(out).any()


def test_per_sequence_split_of_a_graph_plan_sized_for_a_long_model(device):
    # A decode graph plans its splits for the model's whole length: here 4 splits of a
    # 1,024-token maximum, 256 tokens each, over contexts of 1-200 tokens. Per sequence, a
    # 200-token context walks 4 tiles of 16 in each split instead of 13 in the first alone;
    # both must give the same attention.
    case = make_paged_case(
        [200, 1, 47, 130], block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float32,
        device=device,
    )  # fmt: skip
    outs = {}
    for mode in ("per_sequence", "fixed"):
        q, scale, outs[mode] = run_decode(
            case, 2, torch.float32, device, num_splits=4, tile_tokens=16, max_seq_len=1024,
            split_mode=mode,
        )  # fmt: skip
        for seq_idx, (k, v) in enumerate(zip(case.keys, case.values, strict=True)):
            expected = sdpa_attention(q[seq_idx : seq_idx + 1], k, v, scale)[0]
            assert_close(outs[mode][seq_idx], expected, torch.float32)
    assert_close(outs["per_sequence"], outs["fixed"], torch.float32)


def test_unknown_split_mode_is_named(device):
    case = make_paged_case(
        [3], block_size=8, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=device
    )
    with pytest.raises(ValueError, match="split_mode must be one of"):
        run_decode(case, 1, torch.float32, device, split_mode="even")


def test_choose_num_splits_fills_small_batches_only():
    assert choose_num_splits(num_programs=512, max_tiles=1000, target_programs=264) == 1
    assert choose_num_splits(num_programs=8, max_tiles=1000, target_programs=264) == 33
    # Short contexts are not split below four tiles per split.
    assert choose_num_splits(num_programs=8, max_tiles=8, target_programs=264) == 2
    assert choose_num_splits(num_programs=1, max_tiles=100_000, target_programs=264) == 64


@pytest.mark.parametrize("split_mode", ["per_sequence", "fixed"])
def test_which_splits_hold_tokens(device, split_mode):
    # The partials' log-sum-exp is -inf exactly for an empty split: per sequence, a 200-token
    # context (13 tiles of 16) fills all 4 splits (4, 4, 4, 1 tiles); fixed at 256 tokens a
    # split, only its first.
    from kernels.paged_attention import plan_paged_decode, run_paged_decode

    case = make_paged_case(
        [200, 20], block_size=16, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=device
    )
    q = random_queries(2, 1, 16, torch.float32, device)
    launch = plan_paged_decode(
        case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 1, 0.25,
        max_seq_len=1024, num_splits=4, tile_tokens=16, split_mode=split_mode,
    )  # fmt: skip
    run_paged_decode(launch, q, case.k_cache, case.v_cache)
    assert launch.part_lse is not None
    filled = torch.isfinite(launch.part_lse[:, 0, :]).tolist()
    if split_mode == "per_sequence":
        # 20 tokens are 2 tiles: one each for the first two splits.
        assert filled == [[True, True, True, True], [True, True, False, False]]
    else:
        assert filled == [[True, False, False, False], [True, False, False, False]]
