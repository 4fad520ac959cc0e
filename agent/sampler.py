"""Host and GPU resource sampling (DOMAIN.md "Resources").

Importable without Django: the standalone agent (``python -m agent``) and the embedded server's
in-process sampler use the same code. GPU figures come from NVML (``import pynvml``, the
nvidia-ml-py package); without NVML (no driver, no GPU, package missing) sampling goes on for the
host alone and says so in one log line. A figure NVML cannot give is left out (None), never
reported as 0.

What each figure is:
- host ``cpu_percent``: busy CPU time / all CPU time since the previous sample, over all CPUs
  (psutil's ``cpu_times``; the same formula as ``psutil.cpu_percent``);
- host ``memory_used`` = total - available, ``memory_total`` (psutil ``virtual_memory``), so
  host memory % = used / total = psutil's ``percent``;
- GPU ``gpu_memory_used`` / ``gpu_memory_total``: bytes from ``nvmlDeviceGetMemoryInfo``
  (GPU memory % = used / total);
- ``gpu_utilization``: ``nvmlDeviceGetUtilizationRates().gpu`` (share of the last sample period
  in which a kernel ran, 0..100);
- ``gpu_temperature``: ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`` in °C;
- ``gpu_power_watts``: ``nvmlDeviceGetPowerUsage`` (milliwatts) / 1000;
- processes: the GPU's compute and graphics processes (host PIDs), one entry per PID with its
  ``usedGpuMemory`` in bytes; a PID listed in both lists counts once.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field

import psutil

log = logging.getLogger("tracedash.agent")

MAX_LABEL_CHARS = 256  # host, gpu_uuid, gpu_name, process name (ingest.schemas Label)
MAX_PROCESSES = 1024  # per sample (ingest.schemas ResourceSampleIn.processes)
REWARN_SECONDS = 600.0  # a GPU that keeps failing is warned about again at most this often
MIN_CPU_WINDOW = 0.1  # seconds: a CPU % over a shorter window is noise

# NVML errors that mean "this GPU cannot give this figure" (not supported on the model or in MIG
# mode, no permission inside a container, an older driver without the call): the figure is left
# missing. Any other NVMLError (GPU lost, reset required, driver gone, unknown) means the GPU
# itself cannot be read now: it is skipped for this sample and the others are still sampled.
_FIELD_ERROR_NAMES = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound",
                      "NVMLError_NoData", "NVMLError_NotReady", "NVMLError_Deprecated", "NVMLLibraryMismatchError")
# A call the driver's NVML does not have (older or newer than nvidia-ml-py): its versioned
# sibling is tried before the figure is given up. nvidia-ml-py 12+ calls the _v3 process lists,
# which drivers before R510 lack (NVMLLibraryMismatchError); nvmlDeviceGetTemperature is to be
# removed in favour of nvmlDeviceGetTemperatureV.
_MISSING_CALL_NAMES = ("NVMLError_FunctionNotFound", "NVMLError_Deprecated", "NVMLLibraryMismatchError")


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


class _GpuUnreadable(Exception):
    """One GPU could not be read this time (carries the NVML error)."""


class NvmlReader:
    """Reads GPUs through pynvml; ``available`` is False when NVML cannot start (``reason`` says why).

    ``module``: a pynvml-shaped object to read instead of ``import pynvml`` (the demo's simulated
    GPUs, ``demo.gpus``); None, the default, is the real NVML."""

    def __init__(self, module=None):
        self.available = False
        self.reason = ""
        self._known: dict[int, tuple[str, str]] = {}  # index -> (uuid, name) last read
        self._failing: dict[int, tuple[str, float]] = {}  # index -> (message, when last warned)
        self._present: dict[str, tuple[int, str]] = {}  # uuid -> (index, name) of the GPUs in the last sample
        if module is not None:
            pynvml = module
        else:
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"the pynvml module (package nvidia-ml-py) is not installed ({exc})"
                return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError (no driver, library not found), OSError
            self.reason = f"nvmlInit failed: {type(exc).__name__}: {exc}"
            return
        self.nvml = pynvml
        self._field_errors = _classes(pynvml, _FIELD_ERROR_NAMES)
        self._missing_call = _classes(pynvml, _MISSING_CALL_NAMES)
        self.available = True

    def close(self) -> None:
        if self.available:
            self.available = False
            self.reason = "closed"
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down: nothing left to do about it
                log.debug("nvmlShutdown failed: %s", exc)

    def _optional(self, call, *args):
        """``call(*args)``, or None when the GPU does not give this figure; other NVML errors
        mean the GPU is unreadable and propagate."""
        try:
            return call(*args)
        except self._field_errors:
            return None

    def _with_fallback(self, call, fallback: str, *args):
        """``call(*args)``; when the driver lacks that call, the versioned ``fallback`` if pynvml has it."""
        try:
            return call(*args)
        except self._missing_call:
            other = getattr(self.nvml, fallback, None)
            return None if other is None else self._optional(other, *args)
        except self._field_errors:
            return None

    def _describe(self, index: int) -> str:
        uuid, name = self._known.get(index, ("", ""))
        details = ", ".join(part for part in (name, uuid) if part)
        return f"GPU {index} ({details})" if details else f"GPU {index}"

    def sample(self) -> list[GpuSample]:
        if not self.available:
            return []
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._warn_once(-1, f"NVML could not count GPUs: {type(exc).__name__}: {exc}")
            return []
        self._recovered(-1)
        for index in [i for i in self._failing if i >= count]:
            del self._failing[index]
        samples, failed = [], set()
        for index in range(count):
            try:
                gpu = self._read(index)
            except _GpuUnreadable as exc:
                error = exc.__cause__ or exc
                self._warn_once(index, f"{self._describe(index)} skipped: {type(error).__name__}: {error}")
                failed.add(self._known.get(index, ("", ""))[0])
                continue
            self._recovered(index)
            samples.append(gpu)
        self._note_changes(samples, failed, count)
        return samples

    def _note_changes(self, samples: list[GpuSample], failed: set[str], count: int) -> None:
        """One line when a GPU read before is no longer reported at all, or a new one appears."""
        now = {gpu.uuid: (gpu.index, gpu.name) for gpu in samples}
        gone = [(index, name, uuid) for uuid, (index, name) in self._present.items() if uuid not in now and uuid not in failed]
        if gone:
            log.warning("NVML no longer reports %s (%d GPU(s) counted now)",
                        ", ".join(f"GPU {i} ({', '.join(p for p in (n, u) if p)})" for i, n, u in gone), count)
        if self._present:
            for uuid, (index, name) in now.items():
                if uuid not in self._present:
                    log.info("NVML now reports GPU %d (%s)", index, ", ".join(p for p in (name, uuid) if p))
        self._present = {**{uuid: self._present[uuid] for uuid in failed if uuid in self._present}, **now}

    def _read(self, index: int) -> GpuSample:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = self._optional(nvml.nvmlDeviceGetName, handle)
            gpu = GpuSample(index=index, uuid=uuid, name="" if name is None else _text(name))
            self._known[index] = (gpu.uuid, gpu.name)
            memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                gpu.memory_used, gpu.memory_total = int(memory.used), int(memory.total)
            utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            if utilization is not None:
                gpu.utilization = float(utilization.gpu)
            temperature = self._with_fallback(nvml.nvmlDeviceGetTemperature, "nvmlDeviceGetTemperatureV",
                                              handle, nvml.NVML_TEMPERATURE_GPU)
            if temperature is not None:
                gpu.temperature = float(temperature)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                gpu.power_watts = power / 1000.0  # milliwatts
            compute = self._with_fallback(nvml.nvmlDeviceGetComputeRunningProcesses,
                                          "nvmlDeviceGetComputeRunningProcesses_v2", handle) or []
            graphics = self._with_fallback(nvml.nvmlDeviceGetGraphicsRunningProcesses,
                                           "nvmlDeviceGetGraphicsRunningProcesses_v2", handle) or []
        except Exception as exc:  # NVMLError (GPU lost, reset, driver gone) or anything unexpected: skip this GPU
            raise _GpuUnreadable() from exc
        gpu.processes = _merge_processes(list(compute) + list(graphics))
        return gpu

    def _warn_once(self, key: int, message: str) -> None:
        """Warn when a failure starts or changes, then at most every REWARN_SECONDS while it lasts."""
        now = time.monotonic()
        previous = self._failing.get(key)
        if previous is None or previous[0] != message or now - previous[1] >= REWARN_SECONDS:
            log.warning(message)
            self._failing[key] = (message, now)
        else:
            log.debug(message)

    def _recovered(self, key: int) -> None:
        if self._failing.pop(key, None) is not None:
            log.info("%s readable again", "NVML" if key < 0 else self._describe(key))


def _classes(module, names) -> tuple[type, ...]:
    return tuple(cls for cls in (getattr(module, name, None) for name in names)
                 if isinstance(cls, type) and issubclass(cls, Exception))


def _merge_processes(procs) -> list[tuple[int, str, int]]:
    """(pid, name, bytes) per PID: compute and graphics lists merged, a PID in both counted once
    (NVML reports a process's memory on the device, the same figure in either list: the larger
    is kept, never the sum). A process whose memory NVML does not know is left out."""
    memory: dict[int, int] = {}
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        if used is None:
            continue
        pid, used = int(proc.pid), int(used)
        if used > memory.get(pid, -1):
            memory[pid] = used
    return [(pid, _process_name(pid), used) for pid, used in memory.items()]


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return ""


def _cpu_busy_total(times) -> tuple[float, float]:
    """(busy, total) CPU seconds, as psutil.cpu_percent counts them (Linux guest time is already
    inside user/nice; idle and iowait are not busy)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class _CpuMeter:
    """Host CPU % between two readings, kept per sampler (psutil.cpu_percent(None) keeps its
    last reading per thread, shared by every caller in that thread)."""

    def __init__(self, min_window: float):
        self.min_window = min_window
        self._last = _cpu_busy_total(psutil.cpu_times())
        self._at = time.monotonic()

    def percent(self) -> float | None:
        wait = self.min_window - (time.monotonic() - self._at)
        if wait > 0:
            time.sleep(wait)
        busy, total = _cpu_busy_total(psutil.cpu_times())
        last_busy, last_total = self._last
        self._last, self._at = (busy, total), time.monotonic()
        if total - last_total <= 0:
            return None  # no CPU time passed: missing, not 0 %
        return max(0.0, min(100.0, 100.0 * (busy - last_busy) / (total - last_total)))


class ResourceSampler:
    """Produces ``resource_samples`` rows: one host row (gpu_index -1) and one per GPU.

    ``min_cpu_window``: the shortest period the CPU % is measured over; a sample taken sooner after
    the previous one (or after construction) waits for the rest of it.
    """

    def __init__(self, host: str | None = None, nvml: NvmlReader | None = None, *,
                 min_cpu_window: float = MIN_CPU_WINDOW):
        self.host = (host or socket.gethostname() or "unknown")[:MAX_LABEL_CHARS]
        self.nvml = nvml or NvmlReader()
        if not self.nvml.available:
            log.warning("NVML unavailable: %s; sampling host CPU and memory only (no GPU figures)", self.nvml.reason)
        self._cpu = _CpuMeter(min_cpu_window)

    def sample(self) -> list[dict]:
        cpu_percent = self._cpu.percent()
        now_ns = time.time_ns()
        memory = psutil.virtual_memory()
        rows = [self._row(now_ns, gpu_index=-1, cpu_percent=cpu_percent,
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

    def close(self) -> None:
        close = getattr(self.nvml, "close", None)
        if close is not None:
            close()

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


_NUMBERS = ("gpu_utilization", "gpu_memory_used", "gpu_memory_total", "gpu_temperature", "gpu_power_watts",
            "cpu_percent", "memory_used", "memory_total")


def sample_payload(row: dict) -> dict:
    """One sampler row -> one sample of ``POST /api/v1/resources`` (README; ingest.schemas
    ResourceSampleIn): ``time`` as integer unix nanoseconds, ``processes`` as a list of
    {pid, name, gpu_memory}, figures that are None left out."""
    gpu_index = int(row.get("gpu_index", -1))
    out: dict = {"host": str(row["host"])[:MAX_LABEL_CHARS], "time": int(row["time"]), "gpu_index": gpu_index}
    for name in ("gpu_uuid", "gpu_name"):
        if row.get(name):
            out[name] = str(row[name])[:MAX_LABEL_CHARS]
    for name in _NUMBERS:
        value = row.get(name)
        if value is not None:
            out[name] = value
    if gpu_index >= 0:
        processes = [{"pid": int(pid), "name": str(name or "")[:MAX_LABEL_CHARS], "gpu_memory": int(used)}
                     for pid, name, used in zip(row.get("process_pids") or [], row.get("process_names") or [],
                                                row.get("process_gpu_memory") or [])]
        if len(processes) > MAX_PROCESSES:  # keep the largest
            processes = sorted(processes, key=lambda p: p["gpu_memory"], reverse=True)[:MAX_PROCESSES]
        out["processes"] = processes
    return out


def to_payload(rows: list[dict]) -> dict:
    """Sampler rows -> the JSON body ``POST /api/v1/resources`` takes: ``{"samples": [...]}``."""
    return {"samples": [sample_payload(row) for row in rows]}
