"""A small handmade LLMServingSim profile bundle (meta.yaml and tp1/ CSVs) for tiny-llama, with
times that are simple functions of the sizes, so a test can say what each lookup must give."""

from __future__ import annotations

from pathlib import Path

DENSE_US = {
    # layer: (time at 1 token, extra per token), microseconds
    "embedding": (2.0, 0.01),
    "layernorm": (3.0, 0.02),
    "qkv_proj": (10.0, 0.5),
    "rotary_emb": (2.5, 0.01),
    "o_proj": (5.0, 0.25),
    "gate_up_proj": (20.0, 1.0),
    "act_fn": (2.0, 0.02),
    "down_proj": (10.0, 0.5),
    "final_layernorm": (3.0, 0.02),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SEQUENCES = (1, 2, 4, 8, 16, 32)
CHUNKS = (0, 16, 64, 256)
CONTEXTS = (0, 16, 64, 256, 1024)
DECODES = (0, 1, 4, 16)


def dense_us(layer: str, tokens: int) -> float:
    base, per_token = DENSE_US[layer]
    return base + per_token * (tokens - 1)


def attention_us(pc: int, kp: int, nd: int, kvd: int) -> float:
    """Bilinear in each axis (so interpolation inside the grid is exact): 5 us, plus the
    chunk's pairs and the decodes' reads."""
    return 5.0 + 0.001 * pc * kp + 0.002 * pc + 0.01 * nd * kvd + 0.3 * nd


META = """\
profiler_version: 1.0.0
vllm_version: 0.19.0
cuda_version: '13.0'
gpu: Handmade GPU
hardware: HANDMADE
model: servesim/tiny-llama
variant: fp32
tp_degrees: [1]
engine_effective:
  enforce_eager: true
  block_size: 16
  hf_overrides:
    num_hidden_layers: 1
    num_attention_heads: 8
    num_key_value_heads: 2
    intermediate_size: 688
    vocab_size: 8192
measurement_iterations: 3
skew_fit:
  enabled: true
  bucket_axes:
    n_bins: [0, 2, 4, 8, 16, 1000000]
    n_labels: [n<=2, n<=4, n<=8, n<=16, n>16]
    skew_rate_bins: [-0.01, 0.05, 0.15, 0.4, 0.7, 1.01]
    skew_rate_labels: [sr<=5%, sr<=15%, sr<=40%, sr<=70%, sr>70%]
    kv_big_bins: [0, 1024, 4096, 1000000000]
    kv_big_labels: [kvB<=1k, kvB<=4k, kvB>4k]
    kp_bins: [-1, 0, 1000000000]
    kp_labels: [kp=0, kp>0]
  per_tp:
    1:
      alpha_default: 0.1
      bucket_table: tp1/skew_fit.csv
"""
SKEW_ROWS = """\
pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples
0,n<=4,sr<=40%,kvB<=1k,kp=0,0.5,3
"""


def write_bundle(root: Path) -> Path:
    """Write the bundle under ``root`` and return its folder (meta.yaml beside tp1/)."""
    folder = root / "tp1"
    folder.mkdir(parents=True)
    (root / "meta.yaml").write_text(META)
    lines = ["layer,tokens,time_us"]
    lines += [f"{layer},{t},{dense_us(layer, t)}" for layer in DENSE_US for t in TOKENS]
    (folder / "dense.csv").write_text("\n".join(lines) + "\n")
    lines = ["layer,sequences,time_us"]
    lines += [f"lm_head,{n},{50 + 2 * n}" for n in SEQUENCES]
    lines += [f"sampler,{n},{10 + n}" for n in SEQUENCES]
    (folder / "per_sequence.csv").write_text("\n".join(lines) + "\n")
    lines = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for pc in CHUNKS:
        for kp in CONTEXTS if pc else (0,):
            for nd in DECODES:
                for kvd in CONTEXTS[1:] if nd else (0,):
                    if pc or nd:
                        lines.append(f"{pc},{kp},{nd},{kvd},{attention_us(pc, kp, nd, kvd)}")
    (folder / "attention.csv").write_text("\n".join(lines) + "\n")
    (folder / "skew_fit.csv").write_text(SKEW_ROWS)
    return root


MOE_LAYERS = ("gate_up_proj", "down_proj", "act_fn")
"""dense.csv rows a mixture of experts' bundle has not: its MLP is the MoE layer (moe.csv)."""
ACTIVATED = (8, 16, 32, 64, 128)


def moe_us(tokens: int, activated: int) -> float:
    """One MoE layer: a fixed cost, each activated expert's weights, each (token, expert) pair."""
    return 20.0 + 5.0 * activated + 0.01 * 8 * tokens


def write_moe_bundle(root: Path) -> Path:
    """The bundle above for Qwen3-30B-A3B (128 experts, 8 a token): no dense MLP rows, and a
    moe.csv of every activated count a step of that many tokens can reach (at most 8 a token)."""
    write_bundle(root)
    meta = META.replace("servesim/tiny-llama", "Qwen/Qwen3-30B-A3B-Instruct-2507")
    start, end = meta.index("  hf_overrides:"), meta.index("measurement_iterations")
    (root / "meta.yaml").write_text(meta[:start] + meta[end:])
    dense = root / "tp1" / "dense.csv"
    rows = dense.read_text().splitlines()
    dense.write_text("\n".join(r for r in rows if r.split(",")[0] not in MOE_LAYERS) + "\n")
    lines = ["tokens,activated_experts,time_us"]
    lines += [f"{t},{a},{moe_us(t, a)}" for t in TOKENS for a in ACTIVATED if a <= min(128, 8 * t)]
    (root / "tp1" / "moe.csv").write_text("\n".join(lines) + "\n")
    return root
