"""Host and GPU resource sampling (DOMAIN.md "Resources").

Importable without Django: the standalone agent and the embedded server's in-process sampler use
the same code. GPU figures come from NVML (``import pynvml``, the nvidia-ml-py package); without
NVML (no driver, no GPU) sampling goes on for the host alone and says so once in the log.
A figure NVML cannot give is left out (None), never reported as 0.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field

import psutil

log = logging.getLogger("tracedash.agent")


@dataclass
class GpuSample:
    index: int
    uuid: str
    name: str
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    temperature: float | None = None
    power_watts: float | None = None
    processes: list[tuple[int, str, int]] = field(default_factory=list)  # (pid, name, bytes)

    @property
    def memory_percent(self) -> float | None:
        """GPU memory % = used / total from nvmlDeviceGetMemoryInfo (the 85 % rule's figure)."""
        if self.memory_used is None or not self.memory_total:
            return None
        return 100.0 * self.memory_used / self.memory_total


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads GPUs through pynvml; ``available`` is False when NVML cannot start."""

    def __init__(self):
        self.available = False
        self.reason = ""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError (no driver/library), OSError
            self.reason = f"{type(exc).__name__}: {exc}"
            return
        self.nvml = pynvml
        self.available = True

    def _optional(self, call, *args):
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self) -> list[GpuSample]:
        if not self.available:
            return []
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML could not count GPUs: %s", exc)
            return []
        samples = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = GpuSample(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)), name=_text(nvml.nvmlDeviceGetName(handle)))
            except nvml.NVMLError as exc:  # a GPU that fell off the bus: skip it, keep the others
                log.warning("GPU %d unreadable: %s", index, exc)
                continue
            memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                gpu.memory_used, gpu.memory_total = int(memory.used), int(memory.total)
            utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            if utilization is not None:
                gpu.utilization = float(utilization.gpu)
            temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            if temperature is not None:
                gpu.temperature = float(temperature)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                gpu.power_watts = power / 1000.0  # milliwatts
            for proc in self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
                used = getattr(proc, "usedGpuMemory", None)
                if used is None:
                    continue
                gpu.processes.append((int(proc.pid), _process_name(int(proc.pid)), int(used)))
            samples.append(gpu)
        return samples


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return ""


class ResourceSampler:
    """Produces ``resource_samples`` rows: one host row (gpu_index -1) and one per GPU."""

    def __init__(self, host: str | None = None, nvml: NvmlReader | None = None):
        self.host = host or socket.gethostname()
        self.nvml = nvml or NvmlReader()
        if not self.nvml.available:
            log.info("NVML unavailable (%s): sampling host CPU and memory only", self.nvml.reason)
        psutil.cpu_percent(None)  # prime: the first call compares against process start

    def sample(self) -> list[dict]:
        now_ns = time.time_ns()
        memory = psutil.virtual_memory()
        rows = [self._row(now_ns, gpu_index=-1, cpu_percent=float(psutil.cpu_percent(None)),
                          memory_used=int(memory.total - memory.available), memory_total=int(memory.total))]
        for gpu in self.nvml.sample():
            rows.append(self._row(
                now_ns, gpu_index=gpu.index, gpu_uuid=gpu.uuid, gpu_name=gpu.name,
                gpu_utilization=gpu.utilization, gpu_memory_used=gpu.memory_used, gpu_memory_total=gpu.memory_total,
                gpu_temperature=gpu.temperature, gpu_power_watts=gpu.power_watts,
                process_pids=[p[0] for p in gpu.processes], process_names=[p[1] for p in gpu.processes],
                process_gpu_memory=[p[2] for p in gpu.processes],
            ))
        return rows

    def _row(self, time_ns: int, **values) -> dict:
        row = {
            "time": time_ns, "host": self.host, "gpu_index": -1, "gpu_uuid": "", "gpu_name": "",
            "gpu_utilization": None, "gpu_memory_used": None, "gpu_memory_total": None,
            "gpu_temperature": None, "gpu_power_watts": None, "cpu_percent": None,
            "memory_used": None, "memory_total": None,
            "process_pids": [], "process_names": [], "process_gpu_memory": [],
        }
        row.update(values)
        return row
