"""Starting the demo beside a server: the simulator in a thread, an SDK tracer pointed at the
server's own ingestion API, and the workload. Used by ``manage.py serve`` (embedded default) and
``manage.py demo``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import tracedash_sdk as td

from .simulator import SimulatorServer, serve
from .workload import DemoApp, DemoLoop, simulated_gpus, simulator_config


class DemoError(Exception):
    """The demo cannot start (e.g. the simulator's port is taken); the message says what to change."""


@dataclass
class RunningDemo:
    simulator: SimulatorServer
    tracer: td.Tracer
    app: DemoApp
    loop: DemoLoop | None = None
    # One agent.sampler.ResourceSampler per variant's simulated GPU host (demo.gpus): ``serve`` adds
    # them to the embedded sampler's round (agent.tasks.sampler_add).
    gpu_samplers: list = field(default_factory=list)
    _stopped: bool = field(default=False, init=False, repr=False)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def stop(self, flush_timeout: float = 5.0) -> None:
        """Stop the workload, send every span it made (the server must still be serving then),
        then stop the simulator. Safe to call twice, from any thread."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            if self.loop is not None:
                self.loop.stop()
            if self.app.judge is not None:
                self.app.judge.flush()  # the late scores still pending, given now
            self.tracer.shutdown(timeout=flush_timeout)
            self.simulator.stop()


def start_demo(*, endpoint: str, api_key: str, loop: bool, seed: int | None = None, pace: float = 1.0,
               threads: int = 3, simulator_port: int = 0) -> RunningDemo:
    """Start the simulator on 127.0.0.1:``simulator_port`` (0: any free port) and the workload.
    Raises ``DemoError`` naming the port when it is taken."""
    try:
        simulator = serve(simulator_config(seed), port=simulator_port)
    except OSError as exc:
        raise DemoError(f"the demo's LLM simulator cannot listen on 127.0.0.1:{simulator_port}: "
                        f"{exc.strerror or exc}. Set TRACEDASH_DEMO_SIMULATOR_PORT to a free port "
                        "(0 picks one), or TRACEDASH_DEMO=0 to run without the demo") from None
    tracer = td.Tracer(endpoint=endpoint, api_key=api_key, service="chat-api")
    app = DemoApp(tracer, simulator.url, seed=seed, pace=pace)
    from .gpus import gpu_samplers

    demo = RunningDemo(simulator=simulator, tracer=tracer, app=app,
                       gpu_samplers=gpu_samplers(simulator.app.model_stats, simulated_gpus()))
    if loop:
        demo.loop = DemoLoop(app, threads=threads)
        demo.loop.start()
    return demo
