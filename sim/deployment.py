"""Deployments: replicas behind a router (round-robin, least outstanding requests, prefix-cache
aware), or disaggregated prefill and decode pools whose KV moves over a queued link."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from core.request import COUNTERS, Request, RequestStatus
from records.schema import StepRecorder
from sim.data_parallel import DataParallelRouter
from sim.simulator import Replica, to_request
from traces.schema import Trace

ROUTERS = ("round_robin", "least_outstanding", "prefix_aware", "data_parallel")
"""``data_parallel``: vLLM v1's balancer over data-parallel ranks (`DataParallelRouter`)."""


def _ignore_count(count: int) -> None:
    return None


class Router:
    """Picks the replica an arriving request goes to."""

    def __init__(self, kind: str, replicas: list[Replica]) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {kind!r}")
        self.kind = kind
        self.replicas = replicas
        self._next = 0
        self._data_parallel = (
            DataParallelRouter([r.scheduler for r in replicas]) if kind == "data_parallel" else None
        )

    def pick(self, request: Request) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.kind == "round_robin":
            replica = self.replicas[self._next % len(self.replicas)]
            self._next += 1
            return replica
        if self._data_parallel is not None:
            return self.replicas[self._data_parallel.pick(self.replicas[0].env.now)]
        if self.kind == "least_outstanding":
            return min(self.replicas, key=lambda r: (r.scheduler.num_unfinished, r.index))
        # Prefix-aware: the longest cached prefix wins; ties go to the least loaded.
        return min(
            self.replicas,
            key=lambda r: (
                -r.scheduler.cached_prefix_tokens(request),
                r.scheduler.num_unfinished,
                r.index,
            ),
        )


@dataclass
class Transfer:
    """One request's KV moving from a prefill replica to a decode replica."""

    request_id: str
    num_tokens: int
    num_bytes: int
    queued_s: float
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass
class KvLink:
    """The link between the pools: ``parallel`` transfers at a time, the rest queue (FIFO)."""

    env: simpy.Environment
    bandwidth_bytes_per_s: float
    latency_s: float
    time_s: Callable[[int], float]  # transfer time for a number of tokens
    kv_bytes_per_token: int
    parallel: int = 1
    transfers: list[Transfer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.resource = simpy.Resource(self.env, capacity=self.parallel)

    def send(
        self, request: Request, num_tokens: int, done: Callable[[], None]
    ) -> simpy.events.ProcessGenerator:
        record = Transfer(
            request.request_id, num_tokens, num_tokens * self.kv_bytes_per_token, self.env.now
        )
        self.transfers.append(record)
        with self.resource.request() as slot:
            yield slot
            record.start_s = self.env.now
            yield self.env.timeout(self.time_s(num_tokens))
            record.end_s = self.env.now
        done()


@dataclass
class DeploymentOutput:
    requests: list[Request]
    end_s: float
    transfers: list[Transfer]


class Colocated:
    """N identical replicas, each running prefill and decode, behind a router."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: list[Replica],
        router: str,
        on_done: Callable[[int], None] = _ignore_count,
    ) -> None:
        self.env = env
        self.replicas = replicas
        self.router = Router(router, replicas)
        self.on_done = on_done
        for replica in replicas:
            replica.on_finished = lambda finished: on_done(len(finished))

    def arrival_loop(self, trace: Trace, out: list[Request]) -> simpy.events.ProcessGenerator:
        for item in trace.requests:
            if item.arrival_s > self.env.now:
                yield self.env.timeout(item.arrival_s - self.env.now)
            request = to_request(item)
            out.append(request)
            if not self.router.pick(request).add(request):
                self.on_done(1)  # rejected
        for replica in self.replicas:
            replica.close()


class Disaggregated:
    """Prefill pool and decode pool (DistServe / Splitwise style).

    A request's prompt runs on a prefill replica, which samples the first token and keeps the
    KV. A decode replica then reserves blocks for it (waiting for room if it must), the KV
    crosses the link (queueing behind other transfers), the prefill replica frees its copy,
    and the request decodes. Both sides hold the blocks exactly that long.
    """

    def __init__(
        self,
        env: simpy.Environment,
        prefill: list[Replica],
        decode: list[Replica],
        router: str,
        link: KvLink,
        on_done: Callable[[int], None] = _ignore_count,
    ) -> None:
        self.env = env
        self.on_done = on_done
        self.prefill = prefill
        self.decode = decode
        self.prefill_router = Router(router, prefill)
        self.decode_router = Router("least_outstanding", decode)
        self.link = link
        self._users: dict[str, Request] = {}  # the request as the user sees it
        self._decode_side: dict[str, Request] = {}
        self._prefill_side: dict[str, tuple[Request, Replica]] = {}
        self._open_prefills = 0
        self._arrivals_done = False
        for replica in prefill:
            replica.on_finished = self._prefill_finished
        for replica in decode:
            replica.on_transfers = self._start_transfers(replica)
            replica.on_finished = self._decode_finished

    def arrival_loop(self, trace: Trace, out: list[Request]) -> simpy.events.ProcessGenerator:
        for item in trace.requests:
            if item.arrival_s > self.env.now:
                yield self.env.timeout(item.arrival_s - self.env.now)
            user = to_request(item)
            out.append(user)
            self._admit(user)
        self._arrivals_done = True
        for replica in self.prefill:
            replica.close()
        self._maybe_close_decode()

    def _admit(self, user: Request) -> None:
        reason = self.decode[0].scheduler.rejection_reason(user)
        if reason is not None:
            user.status, user.reject_reason, user.finish_s = (
                RequestStatus.REJECTED,
                f"decode pool: {reason}",
                self.env.now,
            )
            self.on_done(1)
            return
        # The prompt alone, once (samples fork on the decode side); it keeps its KV to send.
        prompt = _fresh(
            user, max_output_tokens=1, n=1, hold_kv_on_finish=user.max_output_tokens > 1
        )
        replica = self.prefill_router.pick(prompt)
        if not replica.add(prompt):
            user.status, user.reject_reason, user.finish_s = (
                RequestStatus.REJECTED,
                f"prefill pool: {prompt.reject_reason}",
                self.env.now,
            )
            self.on_done(1)
            return
        self._users[user.request_id] = user
        self._prefill_side[user.request_id] = (prompt, replica)
        self._open_prefills += 1

    def _prefill_finished(self, finished: list[Request]) -> None:
        for prompt in finished:
            self._open_prefills -= 1
            user = self._users[prompt.request_id]
            assert prompt.first_token_s is not None
            if user.max_output_tokens == 1:
                _merge(user, prompt, prompt)  # one token: done on the prefill side
                self.on_done(1)
                continue
            decode = _fresh(user)
            replica = self.decode_router.pick(decode)
            replica.scheduler.add_transferred(decode, prompt.first_token_s, self.env.now)
            self._decode_side[user.request_id] = decode
            replica.notify()
        self._maybe_close_decode()

    def _start_transfers(self, decode_replica: Replica) -> Callable[[list[Request]], None]:
        def start(requests: list[Request]) -> None:
            for decode in requests:
                prompt, prefill_replica = self._prefill_side[decode.request_id]

                def done(rid: str = decode.request_id, src: Replica = prefill_replica) -> None:
                    src.scheduler.release_kv(rid)
                    src.notify()
                    decode_replica.scheduler.kv_arrived(rid)
                    decode_replica.notify()

                self.env.process(self.link.send(decode, prompt.num_prompt_tokens, done))

        return start

    def _decode_finished(self, finished: list[Request]) -> None:
        for decode in finished:
            user = self._users[decode.request_id]
            prompt, _ = self._prefill_side[decode.request_id]
            _merge(user, prompt, decode)
        self.on_done(len(finished))

    def _maybe_close_decode(self) -> None:
        if self._arrivals_done and self._open_prefills == 0:
            for replica in self.decode:
                if not replica.arrivals_done:
                    replica.close()


def _fresh(user: Request, hold_kv_on_finish: bool = False, **changes: object) -> Request:
    """A new request with ``user``'s lengths, samples, prompt identity and priority (no
    state), which keeps its KV when it finishes if ``hold_kv_on_finish``."""
    fields: dict[str, object] = {
        "request_id": user.request_id,
        "arrival_s": user.arrival_s,
        "num_prompt_tokens": user.num_prompt_tokens,
        "max_output_tokens": user.max_output_tokens,
        "n": user.n,
        "prompt_token_ids": user.prompt_token_ids,
        "prefix_hash_ids": user.prefix_hash_ids,
        "hash_block_tokens": user.hash_block_tokens,
        "priority": user.priority,
    }
    request = Request(**(fields | changes))  # type: ignore[arg-type]
    request.hold_kv_on_finish = hold_kv_on_finish
    return request


def _merge(user: Request, prompt: Request, decode: Request) -> None:
    """Fill the user's request from its prefill and decode halves."""
    user.status = RequestStatus.FINISHED
    user.first_scheduled_s = prompt.first_scheduled_s
    user.first_token_s = prompt.first_token_s
    user.finish_s = decode.finish_s
    user.tokens = decode.tokens
    user.num_output_tokens = decode.num_output_tokens
    user.num_computed_tokens = decode.num_computed_tokens
    for counter in COUNTERS:
        total = getattr(prompt, counter) + (getattr(decode, counter) if decode is not prompt else 0)
        setattr(user, counter, total)


def run_deployment(
    trace: Trace,
    make_replica: Callable[[simpy.Environment, int, str, StepRecorder], Replica],
    recorder: StepRecorder,
    *,
    num_replicas: int = 1,
    router: str = "round_robin",
    disagg: tuple[int, int] | None = None,
    link: Callable[[simpy.Environment], KvLink] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> DeploymentOutput:
    """Replay ``trace`` through a colocated or (``disagg=(P, D)``) disaggregated deployment;
    ``on_done`` hears how many requests just finished or were rejected (for progress)."""
    report_done = on_done or _ignore_count
    env = simpy.Environment()
    requests: list[Request] = []
    transfers: list[Transfer] = []
    if disagg is None:
        replicas = [make_replica(env, i, "colocated", recorder) for i in range(num_replicas)]
        deployment: Colocated | Disaggregated = Colocated(env, replicas, router, report_done)
    else:
        assert link is not None
        prefill = [make_replica(env, i, "prefill", recorder) for i in range(disagg[0])]
        decode = [make_replica(env, i, "decode", recorder) for i in range(disagg[1])]
        kv_link = link(env)
        transfers = kv_link.transfers
        deployment = Disaggregated(env, prefill, decode, router, kv_link, report_done)
        replicas = prefill + decode
    for replica in replicas:
        replica.start()
    env.process(deployment.arrival_loop(trace, requests))
    done = env.all_of([replica.process for replica in replicas if replica.process is not None])
    env.run(until=done)
    end_s = max(replica.clock_s for replica in replicas)
    return DeploymentOutput(requests=requests, end_s=end_s, transfers=transfers)
