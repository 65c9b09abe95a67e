"""A handmade LLMServingSim measured-run folder (three requests, its workload, its GPU) for the
importer and validation tests."""

from __future__ import annotations

import json
from pathlib import Path

T0 = 1000.0  # monotonic seconds at the first arrival


def request_line(i: int, queued: float, first: float, last: float, prompt: int, out: int) -> str:
    return json.dumps(
        {
            "request_id": f"bench-{i}",
            "input_toks": prompt,
            "output_toks": out,
            "arrival_time": 1.7e9 + queued,
            "queued_ts": T0 + queued,
            "scheduled_ts": T0 + queued + 0.001,
            "first_token_ts": T0 + first,
            "last_token_ts": T0 + last,
        }
    )


def workload_line(prompt: int, out: int, arrival_ns: int, first_id: int) -> str:
    ids = list(range(first_id, first_id + prompt))
    return json.dumps(
        {
            "input_toks": prompt,
            "output_toks": out,
            "arrival_time_ns": arrival_ns,
            "input_tok_ids": ids,
        }
    )


def write_llmservingsim_run(tmp_path: Path) -> Path:
    """root/run (meta.json, requests.jsonl, config.json) and root/workloads/w.jsonl."""
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "w.jsonl").write_text(
        "\n".join(
            [
                workload_line(8, 3, 0, 100),
                workload_line(4, 2, 500_000_000, 200),
                workload_line(6, 1, 900_000_000, 300),
            ]
        )
        + "\n"
    )
    run = tmp_path / "run"
    run.mkdir()
    meta = {
        "model": "meta-llama/Llama-3.1-8B",
        "engine_kwargs": {
            "model": "meta-llama/Llama-3.1-8B",
            "tensor_parallel_size": 1,
            "data_parallel_size": 1,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 64,
            "max_model_len": None,
        },
        "dataset_path": "workloads/w.jsonl",
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "requests.jsonl").write_text(
        "\n".join(
            [
                request_line(0, 0.0, 0.1, 0.3, 8, 3),  # TTFT 100 ms, TPOT 100 ms, E2E 300 ms
                request_line(1, 0.5, 0.55, 0.65, 4, 2),  # TTFT 50, TPOT 100, E2E 150
                request_line(2, 0.9, 1.1, 1.1, 6, 1),  # TTFT 200, no TPOT, E2E 200
            ]
        )
        + "\n"
    )
    cluster = {
        "nodes": [
            {
                "instances": [
                    {
                        "hardware": "RTXPRO6000",
                        "npu_mem": {"mem_size": 96, "mem_bw": 1597, "mem_util": 0.9},
                    }
                ]
            }
        ]
    }
    (run / "config.json").write_text(json.dumps(cluster))
    return run
