"""Starting the demo beside a server: the simulator in a thread, an SDK tracer pointed at the
server's own ingestion API, and the workload. Used by ``manage.py serve`` (embedded default) and
``manage.py demo``."""

from __future__ import annotations

from dataclasses import dataclass

import tracedash_sdk as td

from .simulator import SimulatorServer, serve
from .workload import DemoApp, DemoLoop, simulator_config


@dataclass
class RunningDemo:
    simulator: SimulatorServer
    tracer: td.Tracer
    app: DemoApp
    loop: DemoLoop | None = None

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.tracer.shutdown(timeout=5.0)
        self.simulator.stop()


def start_demo(*, endpoint: str, api_key: str, loop: bool, seed: int | None = None, pace: float = 1.0,
               threads: int = 3) -> RunningDemo:
    simulator = serve(simulator_config(seed))
    tracer = td.Tracer(endpoint=endpoint, api_key=api_key, service="chat-api")
    app = DemoApp(tracer, simulator.url, seed=seed, pace=pace)
    demo = RunningDemo(simulator=simulator, tracer=tracer, app=app)
    if loop:
        demo.loop = DemoLoop(app, threads=threads)
        demo.loop.start()
    return demo
