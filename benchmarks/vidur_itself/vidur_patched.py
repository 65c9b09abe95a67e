"""Run ``python -m vidur.main`` (vidur 0.0.26) with one fix, and print a summary at exit.

The fix: ``Request.restart()`` (a preempted request, to be recomputed) does not reset the stage
counters 0.0.26 added (``_num_stage_processed_tokens``, ``_is_prefill_stage_complete``), so the
first preemption fails ``assert self._num_stage_processed_tokens <= self.total_tokens``.
The summary (one ``VIDUR_SUMMARY {json}`` line on stderr: completed requests, mean TTFT and
TPOT, restarts, batches, the simulation loop's own wall and CPU time) lets timed runs write no
metrics files. It keeps the generated requests referenced, as Vidur's event queue does anyway.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys
import time
from typing import Any

import vidur.entities.request as vidur_request
import vidur.simulator as vidur_simulator
from vidur.entities import Batch

_restart = vidur_request.Request.restart
_requests: list[Any] = []
_times: dict[str, float] = {}


def _restart_fixed(self: Any) -> None:
    _restart(self)
    self._num_stage_processed_tokens = 0
    self._is_prefill_stage_complete = False


_init_event_queue = vidur_simulator.Simulator._init_event_queue
_run = vidur_simulator.Simulator.run


def _init_event_queue_kept(self: Any) -> None:
    generate = self._request_generator.generate

    def generate_kept() -> Any:
        requests = generate()
        _requests.extend(requests)
        return requests

    self._request_generator.generate = generate_kept
    _init_event_queue(self)


def _run_timed(self: Any) -> None:
    _times["start"], _times["cpu_start"] = time.perf_counter(), time.process_time()
    try:
        _run(self)
    finally:
        _times["end"], _times["cpu_end"] = time.perf_counter(), time.process_time()
        _times["simulated_end_s"] = self._time


@atexit.register
def _summary() -> None:
    done = [r for r in _requests if r.completed]
    n = max(len(done), 1)
    out = {
        "requests": len(_requests),
        "completed": len(done),
        "loop_wall_s": _times.get("end", 0.0) - _times.get("start", 0.0),
        "loop_cpu_s": _times.get("cpu_end", 0.0) - _times.get("cpu_start", 0.0),
        "simulated_end_s": _times.get("simulated_end_s"),
        "batches": Batch._id + 1,
        "requests_restarted": sum(r._num_restarts > 0 for r in _requests),
        "restarts": sum(r._num_restarts for r in _requests),
        "mean_ttft_s": sum(r._prefill_completed_at - r._arrived_at for r in done) / n,
        "mean_tpot_ms": 1000
        * sum((r._completed_at - r._prefill_completed_at) / 511 for r in done)
        / n,
    }
    print("VIDUR_SUMMARY " + json.dumps(out), file=sys.stderr, flush=True)


vidur_request.Request.restart = _restart_fixed
vidur_simulator.Simulator._init_event_queue = _init_event_queue_kept
vidur_simulator.Simulator.run = _run_timed
sys.argv[0] = "vidur.main"
runpy.run_module("vidur.main", run_name="__main__")
