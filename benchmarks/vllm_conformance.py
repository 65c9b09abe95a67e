"""Step-for-step conformance of our scheduler core with vLLM v1's scheduler, without a GPU.

Both schedulers get the same requests and settings. vLLM's ``Scheduler`` is driven with fake
model outputs (one sampled token per request that reaches the end of its known tokens), as
vLLM's own ``tests/v1/core/utils.py`` drives it; our ``core`` Scheduler runs the same
requests with our defaults. Every step is compared: tokens scheduled per request (with the
tokens it had computed before, which shows prefix hits), preempted requests, finished
requests and free blocks after scheduling. A configuration conforms when every step matches.

Requests arriving over time are added to our core when its clock (a fixed step-time model)
passes their arrival; vLLM gets each request before the same step.

--setup (vLLM is never a dependency of this project; it lives in its own environment, ~6 GB,
outside the repository and outside CI)::

    python -m venv /work/vllm-env   # (any folder outside the repository will do)
    /work/vllm-env/bin/pip install --no-deps vllm==0.33.0 torch==2.14.0
    # torch 2.14.0 from PyPI is the CUDA build: importing it needs its CUDA library wheels
    # even on CPU (else "libcudnn.so.9: cannot open shared object file").
    /work/vllm-env/bin/pip install "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,\\
        cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3" "cuda-bindings>=13.0.3,<14" \\
        nvidia-cudnn-cu13==9.24.0.43 nvidia-cusparselt-cu13==0.8.1 \\
        nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5
    # then vLLM's pure-Python dependencies, until the scheduler imports (this list did it
    # for 0.33.0; pip warns about a few pins, which the scheduler does not touch):
    /work/vllm-env/bin/pip install filelock typing-extensions "setuptools>=77.0.3,<81" sympy \
        networkx jinja2 fsspec regex cachetools psutil numpy requests tqdm blake3 py-cpuinfo \
        "transformers>=5.16.1,<5.21.0" huggingface_hub tokenizers safetensors protobuf \
        pydantic msgspec pyzmq cloudpickle pyyaml einops pillow cbor2 pybase64 aiohttp \
        openai_harmony openai uvloop prometheus_client xgrammar fastapi partial_json_parser \
        llguidance
    HF_HUB_OFFLINE=1 /work/vllm-env/bin/python -c "import vllm.v1.core.sched.scheduler"

Run from the repository root (our core is standard-library only, so vLLM's interpreter
imports it from the working tree)::

    HF_HUB_OFFLINE=1 /work/vllm-env/bin/python benchmarks/vllm_conformance.py \\
        --azure ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv

It prints one line per configuration and a summary; the committed output is in
``benchmarks/results/vllm_conformance.txt``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.batch import StepResult  # noqa: E402
from core.config import CacheConfig, SchedulerConfig  # noqa: E402
from core.request import Request, RequestStatus  # noqa: E402
from core.scheduler import Scheduler  # noqa: E402
from core.step import Step  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conformance_workloads import (  # noqa: E402
    Item,
    children,
    fit_to,
    load_items,
    with_priorities,
)

BLOCK_SIZE = 16
STEP_BASE_S = 0.005  # the fixed step-time model that paces arrivals
STEP_PER_TOKEN_S = 2e-5
MAX_STEPS = 200_000


@dataclass(frozen=True, slots=True)
class Setting:
    policy: str  # "chunked" or "continuous"
    budget: int
    max_num_seqs: int
    num_blocks: int
    prefix_caching: bool
    max_model_len: int
    scheduling: str = "fcfs"  # vLLM's --scheduling-policy: "fcfs" or "priority"


# One step: {request_id: (tokens computed before, tokens scheduled)}, preempted ids, finished
# ids, free blocks after scheduling, prefix-hit tokens of the requests admitted in the step.
StepRecord = tuple[dict[str, tuple[int, int]], tuple[str, ...], tuple[str, ...], int, int]


# -- our core -------------------------------------------------------------------------------

# Requests our core took out of a step they were already in, to preempt them (priority
# scheduling's victim, vLLM's too): counted so that the output shows the grid reaches it.
TAKEN_OUT = [0]
_unschedule = Step._unschedule


def _counted_unschedule(self: Step, request: Request) -> None:
    TAKEN_OUT[0] += 1
    _unschedule(self, request)


Step._unschedule = _counted_unschedule  # type: ignore[method-assign]


def run_ours(items: list[Item], st: Setting) -> tuple[list[StepRecord], list[list[str]]]:
    """Our core with its defaults; returns the step records and the ids added before each."""
    cache = CacheConfig(
        num_blocks=st.num_blocks,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=st.prefix_caching,
        max_model_len=st.max_model_len,
        memory_model="paged",
    )
    config = SchedulerConfig(
        policy=st.policy,
        max_num_seqs=st.max_num_seqs,
        max_num_batched_tokens=st.budget,
        scheduling_policy=st.scheduling,  # type: ignore[arg-type]
    )
    s = Scheduler(cache, config)
    pending = sorted(items, key=lambda it: it.arrival_s)
    out_token = {c.request_id: c.output_token for it in items for c in children(it)}
    next_idx = 0
    now = 0.0
    records: list[StepRecord] = []
    added: list[list[str]] = []
    to_add: list[str] = []
    while next_idx < len(pending) or s.has_unfinished():
        while next_idx < len(pending) and pending[next_idx].arrival_s <= now:
            it = pending[next_idx]
            request = Request(
                it.request_id,
                it.arrival_s,
                len(it.prompt_token_ids),
                it.max_tokens,
                n=it.n,
                prompt_token_ids=it.prompt_token_ids,
                priority=it.priority,
            )
            if not s.add_request(request, now):
                raise SystemExit(
                    f"error: our core rejected {it.request_id}: {request.reject_reason}"
                )
            to_add.append(it.request_id)
            next_idx += 1
        was_waiting = {r.request_id for r in s.waiting}
        batch = s.schedule(now)
        if batch.is_empty:
            s.update(batch, StepResult(duration_s=0.0), now)
            if next_idx >= len(pending):
                raise SystemExit(f"error: our core is stuck at step {len(records)}")
            now = max(now, pending[next_idx].arrival_s)
            continue
        scheduled = {
            r.request_id: (r.num_computed_tokens, r.num_new_tokens) for r in batch.requests
        }
        free = s.kv.allocator.num_free_blocks  # type: ignore[attr-defined]
        sampled = {seq_id: out_token[r.request_id] for r in batch.requests for seq_id in r.seq_ids}
        duration = STEP_BASE_S + STEP_PER_TOKEN_S * batch.num_batched_tokens
        finished = s.update(batch, StepResult(duration, sampled_token_ids=sampled), now + duration)
        now += duration
        hits = sum(c for rid, (c, _) in scheduled.items() if rid in was_waiting)
        # The scheduler's own requests that finished: a fanned-out request's children as
        # they end (``update`` reports their parent once, when the last one has).
        done = {r.request_id for r in finished if r.n == 1}
        done |= {
            r.request.request_id
            for r in batch.requests
            if r.request.status is RequestStatus.FINISHED
        }
        records.append(
            (scheduled, tuple(sorted(batch.preempted_ids)), tuple(sorted(done)), free, hits)
        )
        added.append(to_add)
        to_add = []
        if len(records) > MAX_STEPS:
            raise SystemExit("error: our core ran past MAX_STEPS")
    return records, added


# -- vLLM -----------------------------------------------------------------------------------


def model_dir() -> str:
    """A local config.json for vLLM's ModelConfig (no download; weights are never read)."""
    path = Path(tempfile.mkdtemp(prefix="vllm_conformance_model_"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "float16",
    }
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


class VllmDriver:
    """vLLM v1's Scheduler on CPU with fake model outputs."""

    def __init__(self, st: Setting, model: str) -> None:
        import torch
        from vllm.config import (
            CacheConfig as VCacheConfig,
        )
        from vllm.config import (
            DeviceConfig,
            ModelConfig,
            VllmConfig,
        )
        from vllm.config import (
            SchedulerConfig as VSchedulerConfig,
        )
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        scheduler_config = VSchedulerConfig(
            max_num_seqs=st.max_num_seqs,
            max_num_batched_tokens=st.budget,
            max_model_len=st.max_model_len,
            enable_chunked_prefill=st.policy == "chunked",
            is_encoder_decoder=False,
            policy=st.scheduling,
        )
        model_config = ModelConfig(
            model=model,
            dtype="float16",
            seed=0,
            skip_tokenizer_init=True,
            max_model_len=st.max_model_len,
        )
        cache_config = VCacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=st.prefix_caching)
        vllm_config = VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
            device_config=DeviceConfig(device="cpu"),
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=st.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(
                        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                    ),
                )
            ],
        )
        cache_config.num_gpu_blocks = st.num_blocks
        self.scheduler = VScheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK_SIZE,
            log_stats=False,
        )
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.requests: dict[str, object] = {}
        self._out_token: dict[str, int] = {}

    def add(self, it: Item) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VRequest

        params = SamplingParams(max_tokens=it.max_tokens, ignore_eos=True)
        request = VRequest(
            request_id=it.request_id,
            prompt_token_ids=list(it.prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=it.arrival_s,
            block_hasher=self._hasher,
            priority=it.priority,
        )
        self.requests[it.request_id] = request
        self._out_token[it.request_id] = it.output_token
        self.scheduler.add_request(request)

    def step(self) -> StepRecord:
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import RequestStatus as VStatus

        reqs = self.requests
        preemptions = {rid: r.num_preemptions for rid, r in reqs.items()}  # type: ignore[attr-defined]
        was_waiting = {
            rid
            for rid, r in reqs.items()
            if r.status in (VStatus.WAITING, VStatus.PREEMPTED)  # type: ignore[attr-defined]
        }
        out = self.scheduler.schedule()
        scheduled = {
            rid: (reqs[rid].num_computed_tokens - n, n)  # type: ignore[attr-defined]
            for rid, n in out.num_scheduled_tokens.items()
        }
        free = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        preempted = tuple(
            sorted(rid for rid, r in reqs.items() if r.num_preemptions > preemptions[rid])  # type: ignore[attr-defined]
        )
        ids = list(out.num_scheduled_tokens)
        sampled = [
            [self._out_token[rid]]
            if reqs[rid].num_computed_tokens >= reqs[rid].num_tokens  # type: ignore[attr-defined]
            else []
            for rid in ids
        ]
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.scheduler.update_from_output(out, result)
        finished = tuple(sorted(rid for rid in ids if reqs[rid].is_finished()))  # type: ignore[attr-defined]
        for rid in finished:
            del reqs[rid]
        hits = sum(c for rid, (c, _) in scheduled.items() if rid in was_waiting)
        return scheduled, preempted, finished, free, hits


def run_vllm(
    items: list[Item], st: Setting, added: list[list[str]], model: str
) -> list[StepRecord]:
    driver = VllmDriver(st, model)
    by_id = {it.request_id: it for it in items}
    records: list[StepRecord] = []
    for ids in added:
        for rid in ids:
            for child in children(by_id[rid]):
                driver.add(child)
        records.append(driver.step())
        if not records[-1][0]:
            break  # vLLM scheduled nothing where our core did: stop, it is a mismatch
    return records


# -- comparison and grid --------------------------------------------------------------------


def first_difference(ours: list[StepRecord], theirs: list[StepRecord]) -> str | None:
    names = ("scheduled", "preempted", "finished", "free_blocks", "prefix_hit_tokens")
    for idx, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        for name, x, y in zip(names, a, b, strict=True):
            if x != y:
                if isinstance(x, dict) and isinstance(y, dict):
                    keys = sorted(set(x) | set(y))
                    diff = {k: (x.get(k), y.get(k)) for k in keys if x.get(k) != y.get(k)}
                    return (
                        f"step {idx}: {name} differs (ours, vLLM): {dict(list(diff.items())[:4])}"
                    )
                return f"step {idx}: {name} ours={x} vLLM={y}"
    if len(ours) != len(theirs):
        return f"step counts differ: ours {len(ours)}, vLLM {len(theirs)}"
    return None


def grid(
    workloads: dict[str, list[Item]], quick: bool, scheduling: str = "fcfs"
) -> list[tuple[str, Setting]]:
    out: list[tuple[str, Setting]] = []
    for name, items in workloads.items():
        longest = max(len(it.prompt_token_ids) + it.max_tokens for it in items)
        for policy, budget, seqs, blocks, caching in itertools.product(
            ("chunked", "continuous"),
            (512, 2048),
            (8, 256),
            (64, 160, 512),
            (False, True),
        ):
            if quick and seqs == 8:
                continue
            # vLLM needs one request of max_model_len to fit, and without chunking a budget of
            # at least max_model_len; prompts and outputs are cut to fit (both sides alike).
            max_model_len = min(longest, (blocks - 1) * BLOCK_SIZE)
            if policy == "continuous":
                max_model_len = min(max_model_len, budget)
            setting = Setting(policy, budget, seqs, blocks, caching, max_model_len, scheduling)
            out.append((name, setting))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--azure", type=Path, help="the Azure code trace CSV (../shared/...)")
    parser.add_argument("--limit", type=int, default=30, help="requests per trace (default 30)")
    parser.add_argument(
        "--max-output", type=int, default=64, help="cut outputs to this many tokens (default 64)"
    )
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    parser.add_argument("--only", help="run only workloads whose name contains this")
    parser.add_argument(
        "--scheduling",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="vLLM's --scheduling-policy for both schedulers; priority gives the requests "
        "three priority classes (conformance_workloads.with_priorities)",
    )
    parser.add_argument(
        "--setup", action="store_true", help="print how to build the vLLM environment and exit"
    )
    args = parser.parse_args(argv)
    if args.setup:
        doc = __doc__ or ""
        print(doc[doc.index("--setup") : doc.index("It prints one line")].rstrip())
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm
    except ImportError:
        print(
            "error: vllm is not importable by this interpreter; run it with the separate "
            "environment's python (see --setup)",
            file=sys.stderr,
        )
        return 2

    data = ROOT / "traces" / "data"
    sources = {
        name: data / f"{name}.csv"
        for name in ("example", "shared_prefix", "bursty", "parallel_sampling")
    }
    if args.azure is not None:
        sources["azure_code"] = args.azure
    workloads: dict[str, list[Item]] = {}
    for name, path in sources.items():
        if not path.exists():
            print(f"error: {path} not found", file=sys.stderr)
            return 2
        workloads[f"{name}@t0"] = load_items(path, args.limit, True, args.max_output)
        workloads[f"{name}@arrivals"] = load_items(path, args.limit, False, args.max_output)
        for timing, at_zero in (("t0", True), ("arrivals", False)):
            items = load_items(path, args.limit, at_zero, args.max_output, samples=True)
            if any(it.n > 1 for it in items):
                workloads[f"{name}@{timing} n>1"] = items
    if args.scheduling == "priority":
        workloads = {name: with_priorities(items) for name, items in workloads.items()}
    if args.only:
        workloads = {k: v for k, v in workloads.items() if args.only in k}
        if not workloads:
            print(f"error: --only {args.only!r} matches no workload", file=sys.stderr)
            return 2
    model = model_dir()
    print(
        f"vLLM {vllm.__version__}; block_size {BLOCK_SIZE}; our core with its defaults; "
        f"scheduling policy {args.scheduling}"
    )
    print(
        f"{args.limit} requests per trace, outputs cut to {args.max_output} tokens; n > 1 is "
        "fanned out into n requests for both schedulers, as vLLM v1's frontend does, except in "
        "the workloads marked n>1, where our core gets the request with n and fans it out itself"
    )
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    total = same = 0
    for name, st in grid(workloads, args.quick, args.scheduling):
        items = fit_to(workloads[name], st.max_model_len)
        ours, added = run_ours(items, st)
        theirs = run_vllm(items, st, added, model)
        diff = first_difference(ours, theirs)
        total += 1
        same += diff is None
        preempted = sum(len(r[1]) for r in ours)
        hits = sum(r[4] for r in ours)
        label = (
            f"{name:30s} {st.policy:10s} budget {st.budget:4d} seqs {st.max_num_seqs:3d} "
            f"blocks {st.num_blocks:4d} caching {'on ' if st.prefix_caching else 'off'} "
            f"len {st.max_model_len:5d}: {len(ours):5d} steps {preempted:4d} preempted "
            f"{hits:7d} hit tokens"
        )
        print(f"{label}  {'SAME' if diff is None else 'DIFF ' + diff}", flush=True)
    print(f"identical at every step: {same} of {total} configurations")
    if args.scheduling == "priority":
        print(
            f"preemptions of a request already scheduled in the step (taken out of it): "
            f"{TAKEN_OUT[0]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
