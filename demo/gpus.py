"""The demo's simulated GPU hosts: one per served variant of the demo model (``demo-gpu-fp16`` and
``demo-gpu-int8``), read by the agent's own sampler (``agent.sampler.ResourceSampler`` over
``NvmlReader(module=...)``) through a pynvml-shaped object, so their samples take the path a real
GPU's take (the sampler's rows, ``POST /api/v1/resources``'s validation, the same writer).

What a simulated GPU reports, from the LLM simulator's state for its model (``SimulatorApp.model_stats``):

- memory used = runtime overhead (CUDA context, activations) + the variant's weights + the KV-cache
  blocks in use x the bytes one block stands for, the blocks averaged over the time since the
  previous reading (as the utilisation is). (A real vLLM reserves its whole KV cache at start, so
  its NVML figure stays flat; the demo counts the blocks in use so the figure moves with load, and
  averages them so one reading every ten seconds is not a draw from a cache that fills and empties
  within a second.) FP16 weights of an 8 B model are about 15 GiB, INT8 about half;
- utilisation = the share of the time since the previous reading in which at least one request was
  running on that model (prefill or decode): INT8 decodes faster, so the same traffic keeps it busy
  for less time;
- temperature and power follow the utilisation; one process (this one) holds the memory.

Django-free.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

GIB = 1024 ** 3
NVML_TEMPERATURE_GPU = 0


@dataclass(frozen=True)
class SimulatedGpu:
    """One GPU serving ``model`` on host ``host``."""

    host: str
    model: str
    uuid: str
    weights_bytes: int
    kv_cache_bytes: int = 36 * GIB      # what the simulator's whole KV cache (all its blocks) stands for
    overhead_bytes: int = int(1.6 * GIB)  # CUDA context, activations, the engine's own buffers
    total_bytes: int = 80 * GIB
    name: str = "NVIDIA H100 80GB HBM3 (simulated)"


class NVMLError(Exception):
    """pynvml's error class (the sampler catches its subclasses by name; none is raised here)."""


class _Memory:
    def __init__(self, used: int, total: int):
        self.used, self.total, self.free = used, total, total - used


class _Utilization:
    def __init__(self, gpu: float):
        self.gpu, self.memory = gpu, 0


class _Process:
    def __init__(self, pid: int, used: int):
        self.pid, self.usedGpuMemory = pid, used


class SimulatedNvml:
    """A pynvml-shaped module over ``gpus``, each reading ``stats()`` (``SimulatorApp.model_stats``)
    for its model: the calls ``agent.sampler.NvmlReader`` makes, with pynvml's shapes (memory in
    bytes, power in milliwatts, utilisation 0..100)."""

    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError

    def __init__(self, stats, gpus: list[SimulatedGpu]):
        self._stats, self._gpus = stats, list(gpus)
        now = time.monotonic()
        # index -> (monotonic time, busy seconds) at the last reading; the utilisation it gave
        self._last = {i: (now, float(self._model(i)["busy_s"])) for i in range(len(self._gpus))}
        self._util = {i: 0.0 for i in range(len(self._gpus))}
        # index -> (monotonic time, KV block-seconds) at the last memory reading; the memory it gave
        self._kv_last = {i: (now, float(self._model(i)["kv_block_s"])) for i in range(len(self._gpus))}
        self._memory: dict[int, int] = {}
        self._lock = threading.Lock()

    # -- the pynvml calls
    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpus[handle].uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpus[handle].name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return _Memory(self.memory_used(handle), self._gpus[handle].total_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        return _Utilization(self.utilization(handle))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return int(round(34 + 0.45 * self._last_utilization(handle)))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int((70 + 5.6 * self._last_utilization(handle)) * 1000)  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        used = self._memory[handle] if handle in self._memory else self.memory_used(handle)
        return [_Process(os.getpid(), used - 512 * 1024 ** 2)]  # the reading's memory, not a new one

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[_Process]:
        return []

    # -- the figures
    def _model(self, handle: int) -> dict:
        return self._stats().get(self._gpus[handle].model) or {"running": 0, "kv_usage": 0.0, "kv_blocks": 0,
                                                               "kv_block_s": 0.0, "busy_s": 0.0}

    def memory_used(self, handle: int) -> int:
        """Bytes in use: the KV cache's mean usage since the previous memory reading (its usage now
        when no time has passed), plus the weights, the overhead and the running batch's activations."""
        gpu, m, now = self._gpus[handle], self._model(handle), time.monotonic()
        block_s = float(m["kv_block_s"])
        with self._lock:
            then, block_s_then = self._kv_last[handle]
            self._kv_last[handle] = (now, block_s)
        usage = m["kv_usage"]
        if now - then > 0 and m["kv_blocks"]:
            usage = max(0.0, min(1.0, (block_s - block_s_then) / (now - then) / m["kv_blocks"]))
        used = int(gpu.overhead_bytes + gpu.weights_bytes + usage * gpu.kv_cache_bytes
                   + min(m["running"], 8) * 0.25 * GIB)  # activations of the running batch
        self._memory[handle] = used
        return used

    def utilization(self, handle: int) -> float:
        """Percent of the time since the previous reading (the first: since this object was made)
        in which a request ran on this GPU's model."""
        busy, now = float(self._model(handle)["busy_s"]), time.monotonic()
        with self._lock:
            then, busy_then = self._last[handle]
            if now - then > 0:
                self._util[handle] = max(0.0, min(100.0, 100.0 * (busy - busy_then) / (now - then)))
                self._last[handle] = (now, busy)
            return round(self._util[handle], 1)

    def _last_utilization(self, handle: int) -> float:
        return self._util[handle]


def gpu_samplers(stats, gpus: list[SimulatedGpu]):
    """One ``agent.sampler.ResourceSampler`` per simulated host (its GPU read through
    :class:`SimulatedNvml`): what ``serve`` adds to the embedded sampler's round."""
    from agent.sampler import NvmlReader, ResourceSampler

    return [ResourceSampler(host=gpu.host, nvml=NvmlReader(module=SimulatedNvml(stats, [gpu]))) for gpu in gpus]
