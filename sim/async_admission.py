"""When a request reaches the scheduler under vLLM's async scheduling (on by default since vLLM
0.14). Its engine core keeps two steps in flight (``EngineCore.step_with_batch_queue``, a batch
queue of two): it schedules step n + 1 as soon as step n is launched, then blocks on step n's
result, and takes in the requests that arrived meanwhile only after that. A request arriving
while step n runs is therefore added after step n + 1 was scheduled, and the first step that
can hold it is n + 2: one step later than a synchronous engine would take it. An engine with
nothing in flight takes a request in at once.

``HeldArrivals`` holds such a request until just after the step under way ends (one unit in
the last place after it, so the executor has scheduled the next step first), then hands it to
the scheduler; closing the arrivals waits for the last one held. docs/host_time.md says what
this changes and what it leaves out (a finished request's slot is freed one step late too)."""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from core.request import Request


class HeldArrivals:
    """Arrivals held until the step after the one under way is scheduled (see the module).
    Those held in the same step are released together, by one SimPy event."""

    def __init__(
        self, env: simpy.Environment, take: Callable[[Request], None], close: Callable[[], None]
    ) -> None:
        self.env = env
        self._take = take
        self._close = close
        self._batches: dict[float, list[Request]] = {}
        self._close_waits = False

    def hold(self, request: Request, step_end_s: float) -> None:
        """Hand ``request`` over just after ``step_end_s``, when the step under way ends."""
        at_s = math.nextafter(step_end_s, math.inf)
        batch = self._batches.get(at_s)
        if batch is not None:
            batch.append(request)
            return
        self._batches[at_s] = [request]
        now = self.env.now
        delay = max(0.0, at_s - now)
        while now + delay < at_s:
            delay = math.nextafter(delay, math.inf)
        event = self.env.timeout(delay)
        event.callbacks.append(lambda _: self._release(at_s))

    def close(self) -> bool:
        """True if nothing is held (close now); otherwise closing waits for the last one."""
        if self._batches:
            self._close_waits = True
            return False
        return True

    def _release(self, at_s: float) -> None:
        for request in self._batches.pop(at_s):
            self._take(request)
        if self._close_waits and not self._batches:
            self._close_waits = False
            self._close()
