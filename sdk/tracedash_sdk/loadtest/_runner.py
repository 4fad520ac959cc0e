"""The open-loop runner: sends each request at its planned time, measures it, traces it, reports.

One asyncio event loop does everything: a dispatcher coroutine sleeps until the next planned
arrival and starts a task for it (whether or not earlier requests have finished); each task takes a
keep-alive connection (or opens one), sends, reads the streamed answer and records its times; a
progress coroutine prints live figures. Requests still running ``drain_timeout`` seconds after the
last arrival are cancelled and reported as unfinished.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import gc
import os
import time
import uuid
from typing import Any, Dict, List, Optional, TextIO

from ._http import ConnectionPool, HttpError, Target, chat_completion, send_now
from ._plan import ArrivalClock, BurstPlan, Plan, Segment
from ._report import REPORT_VERSION, KneeRule, Result, burst_recovery, summarize, timeline
from ._scenario import RequestMix

LIVE_WINDOW_S = 2.0
SETTLE_FRACTION = 0.25  # achieved RPS of a step is counted over its last three quarters
UNFINISHED = "unfinished when the test ended (still running after the drain timeout)"


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


class LoadTest:
    """Configure once, then :meth:`run` (blocking) or ``await`` :meth:`run_async`; both return the
    report dict (see docs/loadtest.md).

    ``tracer``: a :class:`tracedash_sdk.Tracer`; every request becomes a trace (root span
    ``loadtest request`` with an ``inference`` child ``chat <model>`` carrying TTFT and tokens),
    tagged ``loadtest.run_id`` and ``loadtest.step``. None: no tracing.
    """

    def __init__(self, *, target: Target, plan: Plan, mix: RequestMix, run_id: Optional[str] = None,
                 tracer: Any = None, timeout: float = 60.0, drain_timeout: float = 30.0, window: float = 1.0,
                 knee_rule: Optional[KneeRule] = None, arrivals: str = "uniform", seed: Optional[int] = None,
                 progress: Optional[TextIO] = None, progress_interval: Optional[float] = None,
                 warm_connections: int = 0, spare_connections: Optional[int] = None, metadata: Optional[Dict[str, Any]] = None):
        if timeout <= 0 or drain_timeout < 0 or window <= 0:
            raise ValueError("timeout and window must be > 0, drain timeout >= 0")
        self.target, self.plan, self.mix = target, plan, mix
        self.run_id = run_id or new_run_id()
        self.tracer = tracer
        self.timeout, self.drain_timeout, self.window = float(timeout), float(drain_timeout), float(window)
        self.knee_rule = knee_rule or KneeRule()
        self.clock = ArrivalClock(arrivals, seed)
        self.arrivals, self.seed = arrivals, seed
        self.progress = progress
        tty = bool(progress is not None and getattr(progress, "isatty", lambda: False)())
        self._tty = tty
        self.progress_interval = progress_interval if progress_interval is not None else (0.5 if tty else 5.0)
        self.warm_connections = warm_connections
        self.spare_connections = spare_connections
        self.metadata = dict(metadata or {})
        self.results: List[Result] = []
        self.by_step: Dict[int, List[Result]] = collections.defaultdict(list)
        self.segments: List[Segment] = []
        self._steps_live: List[dict] = []
        self._recent: collections.deque = collections.deque()
        self._errors = 0
        self._done = 0
        self._tasks: set = set()
        self._t0 = 0.0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._current: Optional[Segment] = None
        self.stopped_reason: Optional[str] = None

    # ---- running --------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        return asyncio.run(self.run_async())

    async def run_async(self) -> Dict[str, Any]:
        loop = self._loop = asyncio.get_running_loop()
        # What exists now lives for the whole run: out of the collector's way, so that a full
        # collection during the run (a pause of the scheduler) has less to walk.
        gc.freeze()
        self.pool = ConnectionPool(self.target)
        started_at = datetime.datetime.now(datetime.timezone.utc)
        if self.warm_connections:
            await self.pool.warm(self.warm_connections)
        progress_task = loop.create_task(self._progress_loop()) if self.progress is not None else None
        self._t0 = loop.time()
        wall0 = time.perf_counter()
        try:
            await self._dispatch()
            plan_end = self.segments[-1].end if self.segments else 0.0
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=self.drain_timeout)
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=5.0)
        finally:
            if progress_task is not None:
                progress_task.cancel()
                try:
                    await progress_task
                except asyncio.CancelledError:
                    pass
            self.pool.close()
        ended = loop.time() - self._t0
        if self.progress is not None:
            self._print_progress(final=True)
        report = self._report(started_at, plan_end, ended, time.perf_counter() - wall0)
        return report

    async def _dispatch(self) -> None:
        loop = self._loop
        t0 = self._t0
        start = 0.0
        mix = self.mix
        for seg in self.plan.segments():
            # Spare connections for about 50 ms of arrivals: enough to cover a stall of the answers
            # (or of this process) without a send waiting for a connection to open.
            spare = self.spare_connections
            if spare is None:
                spare = max(4, int(max(seg.qps_start, seg.qps_end) * 0.05))
            seg.start = start
            start = seg.end
            self.segments.append(seg)
            self._current = seg
            bucket = self.by_step[seg.index]
            for t in self.clock.times(seg):
                delay = t0 + t - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                scenario, model, body = mix.next()
                result = Result(seg.index, t, scenario.name, model, scenario.stream)
                spans = self._spans(result)
                # Sent from here, on an idle connection, without an event-loop turn in between; the
                # task only reads the answer. With no idle connection the task opens one and sends.
                conn = send_now(self.pool, body)
                if conn is not None:
                    result.sent = loop.time() - t0
                if spare:
                    self.pool.keep_spare(spare)
                self.results.append(result)
                bucket.append(result)
                seg.planned += 1
                task = loop.create_task(self._one(result, body, conn, spans))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            delay = t0 + seg.end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._steps_live.append(self._step_summary(seg, now=loop.time() - t0))
            if self.plan.stop_after(seg, self):
                self.stopped_reason = "knee"
                break

    def _spans(self, r: Result):
        tracer = self.tracer
        if tracer is None:
            return None
        root = tracer.span("loadtest request", attributes={
            "loadtest.run_id": self.run_id, "loadtest.step": r.step, "loadtest.test_type": self.plan.test_type,
            "loadtest.scenario": r.scenario, "loadtest.planned_offset_s": round(r.planned, 6)}, parent=None)
        call = tracer.span(f"chat {r.model}", phase="inference", model=r.model, parent=root, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": r.model, "gen_ai.request.stream": r.stream,
            "loadtest.run_id": self.run_id, "loadtest.step": r.step})
        return root, call

    def _time_out(self, r: Result, task: "asyncio.Task") -> None:
        r.timed_out = True
        task.cancel()

    async def _one(self, r: Result, body: bytes, conn, spans) -> None:
        loop = self._loop
        t0 = self._t0
        root, call = spans if spans is not None else (None, None)

        def on_sent() -> None:
            r.sent = loop.time() - t0

        timer = loop.call_later(self.timeout, self._time_out, r, asyncio.current_task())
        try:
            outcome = await chat_completion(self.pool, body, stream=r.stream, clock=loop.time, sent_on=conn,
                                            on_sent=on_sent,
                                            on_first_token=call.mark_first_token if call is not None else None)
            r.status = outcome.status
            r.error = outcome.error
            r.output_tokens = outcome.usage_output_tokens if outcome.usage_output_tokens is not None else outcome.output_tokens
            r.input_tokens = outcome.input_tokens
            if outcome.first_token is not None:
                r.first = outcome.first_token - t0
        except asyncio.CancelledError:
            r.error = f"timeout: no complete answer within {self.timeout:g} s" if r.timed_out else UNFINISHED
        except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            r.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            timer.cancel()
            now = loop.time() - t0
            if r.sent is None:
                r.sent = now
            if r.error == UNFINISHED:
                r.end = None
            else:
                r.end = now
                self._done += 1
                self._recent.append((now, None if r.error else now - r.sent))
                if r.error:
                    self._errors += 1
            if root is not None:
                call.set_tokens(input=r.input_tokens, output=r.output_tokens or None)
                root.set_attribute("loadtest.schedule_lag_ms", round((r.sent - r.planned) * 1000.0, 3))
                if r.status:
                    call.set_attribute("http.response.status_code", r.status)
                if r.error:
                    call.set_status("error", r.error)
                    root.set_status("error", r.error)
                call.end()
                root.end()

    # ---- live figures ---------------------------------------------------------------------------
    def _step_summary(self, seg: Segment, now: Optional[float] = None) -> dict:
        out = summarize(self.by_step.get(seg.index, []), seg.start, seg.end, completions=self.results, now=now,
                        settle=SETTLE_FRACTION * seg.duration)
        out.update(index=seg.index, label=seg.label, kind=seg.kind, start_s=round(seg.start, 6),
                   duration_s=seg.duration, target_qps=round(seg.mean_qps, 6))
        return out

    def _final_knee(self, steps: List[dict]) -> Optional[dict]:
        """The knee from complete data (the step where the test stopped, or an earlier one, since
        requests still queued at a step's end only add latency); the live one if complete data
        finds none (errors among requests unfinished at the live check can dilute a step's rate)."""
        if self.plan.test_type != "step":
            return None
        knee = self.knee_rule.find(steps)
        if knee is None and self.stopped_reason == "knee":
            knee = self.knee_now()
        return knee

    def knee_now(self) -> Optional[dict]:
        """The knee among the steps finished so far (unfinished requests count with their age)."""
        return self.knee_rule.find(self._steps_live)

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.progress_interval)
            self._print_progress()

    def _print_progress(self, final: bool = False) -> None:
        loop = self._loop
        now = loop.time() - self._t0
        recent = self._recent
        while recent and recent[0][0] < now - LIVE_WINDOW_S:
            recent.popleft()
        ok = sorted(lat for _, lat in recent if lat is not None)
        span = min(LIVE_WINDOW_S, max(now, 1e-6))
        rps = len(ok) / span
        p95 = f"{ok[int(0.95 * (len(ok) - 1) + 0.5)] * 1000:.0f} ms" if ok else "-"
        seg = self._current
        where = seg.label if seg is not None else "-"
        err_pct = 100.0 * self._errors / self._done if self._done else 0.0
        line = (f"[{now:6.1f}s] {where} | sent {len(self.results)} | done {self._done} | {rps:6.1f} rps | "
                f"p95 {p95} | errors {self._errors} ({err_pct:.1f}%) | in flight {len(self._tasks)}")
        out = self.progress
        try:
            if self._tty:
                out.write("\r\x1b[2K" + line + ("\n" if final else ""))
            else:
                out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass

    # ---- the report -----------------------------------------------------------------------------
    def _report(self, started_at: datetime.datetime, plan_end: float, ended: float, wall: float) -> Dict[str, Any]:
        results = self.results
        steps = [self._step_summary(seg) for seg in self.segments]
        totals = summarize(results, 0.0, plan_end if plan_end > 0 else ended, completions=results)
        report: Dict[str, Any] = {
            "version": REPORT_VERSION,
            "run_id": self.run_id,
            "test_type": self.plan.test_type,
            "target": {"url": self.target.base_url, "models": self.mix.models},
            "started_at": started_at.isoformat(),
            "finished_at": (started_at + datetime.timedelta(seconds=wall)).isoformat(),
            "duration_s": round(plan_end, 6),
            "wall_s": round(wall, 3),
            "stopped": self.stopped_reason or "plan complete",
            "config": {
                "plan": self.plan.describe(), "arrivals": self.arrivals, "seed": self.seed,
                "timeout_s": self.timeout, "drain_timeout_s": self.drain_timeout, "window_s": self.window,
                "knee_rule": self.knee_rule.to_dict(), "scenarios": self.mix.to_list(),
                "connections_opened": getattr(self, "pool", None) and self.pool.opened,
                **self.metadata,
            },
            "totals": totals,
            "steps": steps,
            "knee": self._final_knee(steps),
            "burst": None,
            "timeline": timeline(results, window=self.window, duration=max(ended, plan_end)),
            "groups": {},
        }
        if isinstance(self.plan, BurstPlan):
            plan = self.plan
            report["burst"] = {
                **burst_recovery(results, baseline_start=0.0, baseline_end=plan.baseline_s, burst_end=plan.burst_end,
                                 window=self.window, end=plan_end),
                "baseline_qps": plan.baseline_qps, "peak_qps": plan.peak_qps, "ramp_s": plan.ramp_s,
                "hold_s": plan.hold_s, "burst_start_s": plan.baseline_s,
            }
        if len(self.mix.scenarios) > 1 or len(self.mix.models) > 1:
            for key, attr in (("scenario", "scenario"), ("model", "model")):
                names = list(dict.fromkeys(getattr(r, attr) for r in results))
                report["groups"][key] = {
                    name: summarize([r for r in results if getattr(r, attr) == name], 0.0, plan_end,
                                    completions=[r for r in results if getattr(r, attr) == name])
                    for name in names}
        if self.tracer is not None:
            stats = getattr(self.tracer.exporter, "stats", {}) or {}
            report["config"]["tracing"] = {"service": self.tracer.service, "exporter": dict(stats)}
        return report


def default_tracer(*, endpoint: Optional[str], api_key: Optional[str], service: str = "loadtest"):
    """A tracer sending to ``endpoint`` (default TRACEDASH_ENDPOINT), or None when there is none."""
    from .._tracer import Tracer

    endpoint = endpoint or os.environ.get("TRACEDASH_ENDPOINT")
    if not endpoint:
        return None
    return Tracer(endpoint=endpoint, api_key=api_key or os.environ.get("TRACEDASH_API_KEY"), service=service,
                  max_queue_spans=200_000, max_batch_spans=2_000)

