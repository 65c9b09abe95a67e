"""The wrappers' checks (shapes, dtypes, strides, devices) and the backend choice, all of
which must fail before any launch."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kernels import contracts  # noqa: E402
from kernels.cache_ops import copy_blocks, store_kv  # noqa: E402
from kernels.paged_attention import paged_decode_attention  # noqa: E402
from kernels.prefill_attention import paged_prefill_attention  # noqa: E402


def decode_args(**overrides):
    args = {
        "q": torch.zeros(2, 4, 16),
        "k_cache": torch.zeros(3, 8, 2, 16),
        "v_cache": torch.zeros(3, 8, 2, 16),
        "block_tables": torch.zeros(2, 3, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "scale": 0.25,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"q": torch.zeros(2, 4, 16, dtype=torch.float16)}, "q dtype"),
        ({"q": torch.zeros(2, 3, 16)}, "multiple of num_kv_heads"),
        ({"q": torch.zeros(2, 4, 32)}, "head_dim"),
        ({"q": torch.zeros(2, 16, 4).transpose(1, 2)}, "stride 1"),
        (
            {"k_cache": torch.zeros(3, 12, 2, 16), "v_cache": torch.zeros(3, 12, 2, 16)},
            "block_size",
        ),
        ({"k_cache": torch.zeros(3, 8, 2, 24), "v_cache": torch.zeros(3, 8, 2, 24)}, "head_dim"),
        ({"v_cache": torch.zeros(4, 8, 2, 16)}, "v_cache shape"),
        ({"v_cache": torch.zeros(3, 8, 2, 16, dtype=torch.float16)}, "v_cache dtype"),
        ({"k_cache": torch.zeros(3, 8, 2, 16, dtype=torch.int32)}, "k_cache dtype"),
        ({"seq_lens": torch.ones(3, dtype=torch.int32)}, "seq_lens must have shape"),
        ({"seq_lens": torch.ones(2)}, "seq_lens dtype"),
        ({"block_tables": torch.zeros(2, dtype=torch.int32)}, "block_tables must have 2 dims"),
        ({"seq_lens": torch.ones(2, dtype=torch.int32, device="meta")}, "seq_lens is on meta"),
    ],
)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_decode_rejects_bad_inputs(overrides, message, backend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(**decode_args(**overrides), backend=backend)


def test_prefill_rejects_mismatched_metadata():
    args = decode_args()
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="context_lens must have shape"):
        paged_prefill_attention(
            args["q"],
            args["k_cache"],
            args["v_cache"],
            args["block_tables"],
            qsl,
            args["seq_lens"],
            torch.zeros(3, dtype=torch.int32),
            0.25,
        )
    with pytest.raises(ValueError, match="query_start_loc must have shape"):
        paged_prefill_attention(
            args["q"],
            args["k_cache"],
            args["v_cache"],
            args["block_tables"],
            qsl[:2],
            args["seq_lens"],
            args["seq_lens"],
            0.25,
        )


def test_store_and_copy_reject_bad_inputs():
    k_cache = torch.zeros(3, 8, 2, 16)
    slots = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="k must be"):
        store_kv(torch.zeros(4, 1, 16), torch.zeros(4, 2, 16), k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="but v has 5"):
        store_kv(torch.zeros(4, 2, 16), torch.zeros(5, 2, 16), k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv(torch.zeros(4, 2, 16), torch.zeros(4, 2, 16), k_cache, k_cache.clone(), slots[:3])
    with pytest.raises(ValueError, match="pairs must have shape"):
        copy_blocks(k_cache, k_cache.clone(), torch.zeros(2, 3, dtype=torch.int64))
    strided = torch.zeros(3, 8, 4, 16)[:, :, :2]  # blocks not contiguous inside
    with pytest.raises(ValueError, match="contiguous inside"):
        copy_blocks(strided, strided.clone(), [(0, 1)])


def test_resolve_backend(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert contracts.resolve_backend("cpu") == "torch"
    assert contracts.resolve_backend("cpu", "torch") == "torch"
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        contracts.resolve_backend("cpu", "triton")
    assert contracts.resolve_backend("cuda:0") == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert contracts.resolve_backend("cpu") == "triton"
    with pytest.raises(ValueError, match="backend must be one of"):
        contracts.resolve_backend("cpu", "cuda")


def test_torch_backend_runs_the_reference_without_the_interpreter(monkeypatch):
    # What a CPU caller without TRITON_INTERPRET gets from "auto".
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    k_cache = torch.randn(3, 8, 1, 16)
    args = decode_args(q=torch.randn(2, 2, 16), k_cache=k_cache, v_cache=k_cache.clone())
    args["block_tables"] = torch.tensor([[2, 0, 1], [1, 2, 0]], dtype=torch.int32)
    args["seq_lens"] = torch.tensor([1, 20], dtype=torch.int32)
    out = paged_decode_attention(**args)
    k0 = k_cache[2, 0]  # sequence 0 has one token: the output is its value row
    torch.testing.assert_close(out[0], k0.expand(2, 16))
    assert math.isfinite(out.sum().item())
