"""`python -m sim costmodel check`: the analytic cost model against Vidur's measured GPU op
times, op by op and for whole steps built as the sum of measured ops, with median and max
absolute % error and the signed bias."""

from __future__ import annotations

import argparse
import json
import statistics
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from core.model.presets import load_model_spec
from core.model.spec import ModelSpec, check_tp
from sim.costmodel.kernel_costs import allreduce_s
from sim.costmodel.layer_ops import ELEMENTWISE_CALLS, LINEAR_OPS, LayerOps
from sim.costmodel.roofline import RooflineCostModel
from sim.costmodel.vidur_profiles import (
    AllReduceRow,
    AttentionRow,
    MlpRow,
    find_vidur_files,
    read_allreduce_csv,
    read_attention_csv,
    read_mlp_csv,
)
from sim.specs.hardware import (
    HARDWARE_PRESETS,
    NODE_TYPES,
    HardwareSpec,
    get_hardware_preset,
    hardware_for_node,
)

DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_CONTEXT_TOKENS = 2048  # context per sequence of the whole decode steps with attention


@dataclass(frozen=True, slots=True)
class Comparison:
    """One measured shape: `kind` is linear, elementwise, allreduce, attention, decode_step or
    prefill_step; `op` the Vidur op (or node type, or step); `shape` says where."""

    kind: str
    op: str
    shape: str
    measured_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float:
        """Signed: positive when we predict more time than was measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s * 100


def _op_kind(op: str) -> str:
    return "linear" if op in LINEAR_OPS else "elementwise"


def compare_mlp(
    rows: list[MlpRow], model: ModelSpec, hw: HardwareSpec, tps: set[int]
) -> list[Comparison]:
    """Every op of every row at the wanted TP degrees, per layer and rank."""
    out = []
    ops_by_tp = {tp: LayerOps(model, hw, tp) for tp in tps}
    for row in rows:
        if row.tp not in ops_by_tp:
            continue
        for op, measured in row.op_s.items():
            if measured > 0:
                predicted = ops_by_tp[row.tp].op_s(op, row.num_tokens)
                shape = f"tp={row.tp} tokens={row.num_tokens}"
                out.append(Comparison(_op_kind(op), op, shape, measured, predicted))
    return out


def _node_hardware(hw: HardwareSpec, node: str) -> HardwareSpec:
    """`hw` wired as `node`; a node type we do not know is taken as the preset describes it."""
    return hardware_for_node(hw, node) if node in NODE_TYPES else hw


def compare_allreduce(rows: list[AllReduceRow], hw: HardwareSpec, node: str) -> list[Comparison]:
    """Every all-reduce row, priced on `hw` wired as `node`."""
    node_hw = _node_hardware(hw, node)
    out = []
    for row in rows:
        if row.time_s > 0:
            predicted = allreduce_s(node_hw, row.size_bytes, row.num_workers, row.devices_per_node)
            shape = (
                f"workers={row.num_workers} per_node={row.devices_per_node} bytes={row.size_bytes}"
            )
            out.append(Comparison("allreduce", node, shape, row.time_s, predicted))
    return out


def predict_attention(roofline: RooflineCostModel, row: AttentionRow) -> float:
    """One attention row's time as our model prices it, per layer (as the file times it)."""
    layers = roofline.model.num_layers
    if row.block_size != roofline.block_size:
        raise ValueError(
            f"an attention row at block size {row.block_size} priced by a roofline of block "
            f"size {roofline.block_size}"
        )
    if row.is_prefill:
        chunks = ((row.prefill_chunk_size, row.kv_cache_size),)
        return roofline.prefill_attention_s(chunks) / layers
    blocks = -(-row.kv_cache_size // row.block_size)
    kv_read = row.batch_size * blocks * row.block_size
    total = roofline.decode_attention_s(row.batch_size, row.batch_size * row.kv_cache_size, kv_read)
    return total / layers


def _attention_shape(row: AttentionRow) -> str:
    if row.is_prefill:
        return f"tp={row.tp} chunk={row.prefill_chunk_size} context={row.kv_cache_size}"
    return f"tp={row.tp} batch={row.batch_size} context={row.kv_cache_size}"


def compare_attention(
    rows: list[AttentionRow], rooflines: dict[int, RooflineCostModel]
) -> list[Comparison]:
    """Every attention row whose TP degree we check."""
    out = []
    for row in rows:
        roofline = rooflines.get(row.tp)
        if roofline is not None and row.time_s > 0:
            op = "prefill" if row.is_prefill else "decode"
            predicted = predict_attention(roofline, row)
            out.append(Comparison("attention", op, _attention_shape(row), row.time_s, predicted))
    return out


class AllReduceTable:
    """Measured all-reduce times of one node type at `tp` workers in one node, by message size:
    the median of the `NEIGHBOURS` measured sizes nearest it (neighbouring small sizes differ by
    up to 2x in the raw medians, run-to-run noise a single point would pass into the step);
    None outside the measured range.

    `mixture=True` takes the mean of the `MIXTURE_NEIGHBOURS` nearest instead. Small messages
    take one of two times (about 20-35 or 55-65 us on A100, even among the repeats of one size:
    `benchmarks/costmodel_vs_measured.py` counts them), so the median of a few neighbours is
    whichever mode that stretch of the sweep happened to be in, while a long run of steps pays
    the mixture's mean; this is that mean, a second yardstick for whole steps."""

    NEIGHBOURS = 5
    MIXTURE_NEIGHBOURS = 15

    def __init__(self, rows: list[AllReduceRow], tp: int, mixture: bool = False) -> None:
        points = sorted(
            (r.size_bytes, r.time_s) for r in rows if r.num_workers == r.devices_per_node == tp
        )
        self.sizes = [size for size, _ in points]
        self.times = [time for _, time in points]
        self.mixture = mixture

    def __call__(self, size: float) -> float | None:
        if not self.sizes or not self.sizes[0] <= size <= self.sizes[-1]:
            return None
        count = self.MIXTURE_NEIGHBOURS if self.mixture else self.NEIGHBOURS
        i = bisect_left(self.sizes, size)
        low = max(0, min(i - count // 2, len(self.sizes) - count))
        window = self.times[low : low + count]
        return statistics.fmean(window) if self.mixture else statistics.median(window)


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What a whole step is built from: one TP degree's mlp rows by token count, its measured
    all-reduce table (None without a network file) and attention rows (empty without one)."""

    tp: int
    mlp: dict[int, MlpRow]
    allreduce: AllReduceTable | None
    attention: dict[tuple[bool, int, int], AttentionRow]


def _step(
    inputs: StepInputs,
    roofline: RooflineCostModel,
    num_tokens: int,
    attention_key: tuple[bool, int, int],
) -> tuple[float, float] | None:
    """(measured, predicted) seconds of one step of `num_tokens` tokens: per layer the mlp.csv
    ops (the residual add twice), two all-reduces when tp > 1 and a network file is present,
    and attention when the attention file has this shape; times the layers; plus the embedding.
    Both sides add exactly the same parts. None when the mlp file lacks this token count."""
    row = inputs.mlp.get(num_tokens)
    if row is None:
        return None
    ops = roofline.layer_ops
    layer_measured = 0.0
    layer_predicted = 0.0
    for op, measured in row.op_s.items():
        if op == "emb":
            continue
        calls = ELEMENTWISE_CALLS.get(op, 1)
        layer_measured += calls * measured
        layer_predicted += calls * ops.op_s(op, num_tokens)
    if inputs.tp > 1 and inputs.allreduce is not None:
        size = num_tokens * roofline.model.hidden_size * roofline.model.dtype_bytes
        measured_ar = inputs.allreduce(size)
        if measured_ar is None:
            return None
        layer_measured += 2 * measured_ar
        layer_predicted += 2 * roofline.allreduce_call_s(size)
    attention = inputs.attention.get(attention_key)
    if attention is not None:
        layer_measured += attention.time_s
        layer_predicted += predict_attention(roofline, attention)
    layers = roofline.model.num_layers
    emb_measured = row.op_s.get("emb", 0.0)
    emb_predicted = ops.op_s("emb", num_tokens) if "emb" in row.op_s else 0.0
    return layers * layer_measured + emb_measured, layers * layer_predicted + emb_predicted


def compare_steps(inputs: StepInputs, roofline: RooflineCostModel) -> list[Comparison]:
    """Decode steps at batch 1-256 (context 2,048 where attention is measured) and prefill
    steps of one 128-8K-token prompt, where the mlp file has those token counts."""
    out = []
    parts = "ops" + ("+allreduce" if inputs.tp > 1 and inputs.allreduce else "")
    for batch in DECODE_BATCHES:
        key = (False, batch, DECODE_CONTEXT_TOKENS)
        pair = _step(inputs, roofline, batch, key)
        if pair is not None:
            extra = "+attention" if key in inputs.attention else ""
            shape = f"tp={inputs.tp} batch={batch} ({parts}{extra})"
            out.append(Comparison("decode_step", "decode", shape, *pair))
    for num_tokens in PREFILL_TOKENS:
        key = (True, num_tokens, 0)
        pair = _step(inputs, roofline, num_tokens, key)
        if pair is not None:
            extra = "+attention" if key in inputs.attention else ""
            shape = f"tp={inputs.tp} tokens={num_tokens} ({parts}{extra})"
            out.append(Comparison("prefill_step", "prefill", shape, *pair))
    return out


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What was read and every comparison made."""

    files: dict[str, str]
    comparisons: list[Comparison]


def run_check(
    vidur_dir: str | Path,
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int | None = None,
    gpu: str | None = None,
    node: str | None = None,
    allreduce_mixture: bool = False,
) -> CheckResult:
    """Compare every file present in `vidur_dir` that fits `model` (all TP degrees, or `tp`).
    Whole steps use the all-reduce of `node` (default: `dgx` if present, else the only one;
    `none`: steps without all-reduce, to see the compute model apart from the network), its
    measured side the local median or, with `allreduce_mixture`, the local mean
    (`AllReduceTable`)."""
    found = find_vidur_files(vidur_dir, model, gpu)
    files: dict[str, str] = {}
    comparisons: list[Comparison] = []
    mlp_rows = read_mlp_csv(found.mlp) if found.mlp else []
    tps = {row.tp for row in mlp_rows} if tp is None else {tp}
    attention_rows = read_attention_csv(found.attention) if found.attention else []
    if tp is None:
        tps |= {row.tp for row in attention_rows}
    tps = {t for t in tps if _valid_tp(model, t)}
    block_size = _block_size(attention_rows)
    rooflines = {
        t: RooflineCostModel(model, hardware, t, block_size=block_size) for t in sorted(tps)
    }
    if found.mlp:
        files["mlp"] = str(found.mlp)
        comparisons += compare_mlp(mlp_rows, model, hardware, tps)
    if found.attention:
        files["attention"] = str(found.attention)
        comparisons += compare_attention(attention_rows, rooflines)
    allreduce_rows: dict[str, list[AllReduceRow]] = {}
    for node_type, path in found.networks.items():
        files[f"network/{node_type}"] = str(path)
        allreduce_rows[node_type] = read_allreduce_csv(path)
        comparisons += compare_allreduce(allreduce_rows[node_type], hardware, node_type)
    if node == "none":
        node = None
    elif node is None and allreduce_rows:
        node = "dgx" if "dgx" in allreduce_rows else sorted(allreduce_rows)[0]
    elif node is not None and node not in allreduce_rows:
        raise ValueError(f"--node {node!r}: no network/{found.gpu}_{node}/all_reduce.csv")
    for t, roofline in rooflines.items():
        if node is not None:
            node_hardware = _node_hardware(hardware, node)
            roofline = RooflineCostModel(model, node_hardware, t, block_size=block_size)
        inputs = StepInputs(
            tp=t,
            mlp={row.num_tokens: row for row in mlp_rows if row.tp == t},
            allreduce=(
                AllReduceTable(allreduce_rows[node], t, allreduce_mixture) if node else None
            ),
            attention={
                (
                    row.is_prefill,
                    row.prefill_chunk_size if row.is_prefill else row.batch_size,
                    row.kv_cache_size,
                ): row
                for row in attention_rows
                if row.tp == t and (row.is_prefill or row.kv_cache_size == DECODE_CONTEXT_TOKENS)
            },
        )
        comparisons += compare_steps(inputs, roofline)
    return CheckResult(files, comparisons)


# Vidur profiles attention at vLLM's default block size; a check without an attention file
# prices nothing per block, so the value is only the roofline's required one.
VIDUR_BLOCK_SIZE = 16


def _block_size(rows: list[AttentionRow]) -> int:
    """The block size the attention file was measured at (one for the whole file)."""
    sizes = {row.block_size for row in rows}
    if len(sizes) > 1:
        raise ValueError(f"attention rows at several block sizes {sorted(sizes)}: check one")
    return sizes.pop() if sizes else VIDUR_BLOCK_SIZE


def _valid_tp(model: ModelSpec, tp: int) -> bool:
    try:
        check_tp(model, tp)
    except ValueError:
        return False
    return True


def summarize(comparisons: list[Comparison], by_op: bool = True) -> list[dict[str, object]]:
    """Per (kind, op), or per kind: count, median / 90th-percentile / max absolute % error,
    median signed % error (the bias), and the worst shape."""
    groups: dict[tuple[str, str], list[Comparison]] = {}
    for c in comparisons:
        groups.setdefault((c.kind, c.op if by_op else "*"), []).append(c)
    out: list[dict[str, object]] = []
    for (kind, op), group in groups.items():
        errors = sorted(abs(c.error_pct) for c in group)
        worst = max(group, key=lambda c: abs(c.error_pct))
        out.append(
            {
                "kind": kind,
                "op": op,
                "count": len(group),
                "median_abs_error_pct": statistics.median(errors),
                "p90_abs_error_pct": errors[min(len(errors) - 1, int(0.9 * len(errors)))],
                "max_abs_error_pct": errors[-1],
                "bias_pct": statistics.median(c.error_pct for c in group),
                "worst": f"{worst.op} {worst.shape}: {worst.error_pct:+.1f}%",
            }
        )
    return out


def format_summary(rows: list[dict[str, object]]) -> str:
    lines = [
        f"{'kind':13s} {'op':25s} {'n':>6s} {'med|e|%':>8s} {'p90|e|%':>8s} {'max|e|%':>8s} "
        f"{'bias%':>7s}  worst"
    ]
    for r in rows:
        lines.append(
            f"{r['kind']!s:13s} {r['op']!s:25s} {r['count']!s:>6s} "
            f"{r['median_abs_error_pct']:8.1f} {r['p90_abs_error_pct']:8.1f} "
            f"{r['max_abs_error_pct']:8.1f} {r['bias_pct']:+7.1f}  {r['worst']}"
        )
    return "\n".join(lines)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vidur-dir", required=True, help="a Vidur profile directory")
    parser.add_argument("--model", required=True, help="model preset or config.json path")
    parser.add_argument("--hardware", required=True, choices=sorted(HARDWARE_PRESETS))
    parser.add_argument("--tp", type=int, default=None, help="one TP degree (default: all)")
    parser.add_argument("--gpu", default=None, help="folder under compute/ (default: the only)")
    parser.add_argument(
        "--node",
        default=None,
        help="network node type whose all-reduce whole steps use (default: dgx if present; "
        "none: steps without all-reduce)",
    )
    parser.add_argument("--json", default=None, help="also write every comparison here")


def check_command(args: argparse.Namespace) -> int:
    if args.json and Path(args.json).is_dir():
        raise ValueError(f"--json {args.json}: is a directory; give a .json file name")
    model = load_model_spec(args.model)
    hardware = get_hardware_preset(args.hardware)
    if args.tp is not None:
        check_tp(model, args.tp)
    result = run_check(args.vidur_dir, model, hardware, args.tp, args.gpu, args.node)
    if not result.comparisons:
        raise ValueError(f"{args.vidur_dir}: no measured file fits {model.name}")
    if all(c.kind == "allreduce" for c in result.comparisons):
        read = ", ".join(sorted(result.files)) or "nothing"
        at = f" at --tp {args.tp}" if args.tp is not None else ""
        raise ValueError(
            f"{args.vidur_dir}: no measured GPU op fits {model.name}{at} (read: {read}); only "
            "all-reduce, which is not the model's, could be compared. Vidur measured its ops "
            "per model and tensor-parallel degree under compute/<gpu>/<org>/<model>/"
        )
    for kind, path in result.files.items():
        print(f"read {kind}: {path}")
    print(format_summary(summarize(result.comparisons, by_op=True)))
    print()
    print(format_summary(summarize(result.comparisons, by_op=False)))
    if args.json:
        payload = {
            "model": model.name,
            "hardware": hardware.name,
            "files": result.files,
            "summary_by_op": summarize(result.comparisons, by_op=True),
            "summary_by_kind": summarize(result.comparisons, by_op=False),
            "comparisons": [
                {
                    "kind": c.kind,
                    "op": c.op,
                    "shape": c.shape,
                    "measured_s": c.measured_s,
                    "predicted_s": c.predicted_s,
                    "error_pct": c.error_pct,
                }
                for c in result.comparisons
            ],
        }
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 0
