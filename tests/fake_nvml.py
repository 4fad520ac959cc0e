"""A fake ``pynvml`` module for the agent's tests, installed at the import boundary:

    fake = FakeNvml([FakeGpu("GPU-a", "Fake H100", memory_used=..., memory_total=...)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)

It implements exactly the pynvml calls the sampler makes (and nothing else, so a new call in the
sampler fails loudly here until the fake learns it), with pynvml's shapes: ``NVMLError`` carrying
``.value`` and one subclass per error code (``NVMLError_GpuIsLost``…), structs as objects with
pynvml's attribute names, power in milliwatts, ``usedGpuMemory`` None when NVML does not know it.
Every device call needs ``nvmlInit`` first (``NVMLError_Uninitialized`` otherwise), like the real one.

Scripting: ``FakeGpu`` fields are the figures; ``fake.fail(index, "nvmlDeviceGetMemoryInfo",
NVMLError_GpuIsLost, times=1)`` makes a call raise (``times=None``: until ``fake.heal``), also
``NVMLLibraryMismatchError``, which pynvml raises when the driver lacks a call's versioned target
(the sampler then looks for a versioned sibling such as ``nvmlDeviceGetTemperatureV``, absent here
unless a test sets it); ``gpu.lost = True`` makes every call on that GPU raise GpuIsLost; removing
a GPU from ``fake.gpus`` makes it vanish from the count; ``FakeNvml(init_error=...)`` makes
nvmlInit fail.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

NVML_TEMPERATURE_GPU = 0

_CODES = {  # pynvml's NVML_ERROR_* values and messages
    "Uninitialized": (1, "Uninitialized"),
    "InvalidArgument": (2, "Invalid Argument"),
    "NotSupported": (3, "Not Supported"),
    "NoPermission": (4, "Insufficient Permissions"),
    "NotFound": (6, "Not Found"),
    "DriverNotLoaded": (9, "Driver Not Loaded"),
    "Timeout": (10, "Timeout"),
    "LibraryNotFound": (12, "NVML Shared Library Not Found"),
    "FunctionNotFound": (13, "Function Not Found"),
    "GpuIsLost": (15, "GPU is lost"),
    "ResetRequired": (16, "GPU requires restart"),
    "NoData": (21, "No data"),
    "NotReady": (27, "Not ready"),
    "Unknown": (999, "Unknown Error"),
}
_MESSAGES = {code: message for code, message in _CODES.values()}


class NVMLError(Exception):
    """pynvml.NVMLError: ``NVMLError(code)``; subclasses take no argument."""

    value = 999

    def __init__(self, value: int | None = None):
        if value is not None:
            self.value = value
        super().__init__(self.value)

    def __str__(self):
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLLibraryMismatchError(Exception):
    """pynvml raises this (not an NVMLError) when an unversioned call's versioned target is missing
    from the driver's NVML, e.g. nvmlDeviceGetComputeRunningProcesses (_v3) on drivers before R510."""


ERROR_CLASSES = {f"NVMLError_{name}": type(f"NVMLError_{name}", (NVMLError,), {"value": code, "__module__": __name__})
                 for name, (code, _) in _CODES.items()}
globals().update(ERROR_CLASSES)
NVMLError_GpuIsLost = ERROR_CLASSES["NVMLError_GpuIsLost"]
NVMLError_NotSupported = ERROR_CLASSES["NVMLError_NotSupported"]
NVMLError_NoPermission = ERROR_CLASSES["NVMLError_NoPermission"]
NVMLError_LibraryNotFound = ERROR_CLASSES["NVMLError_LibraryNotFound"]
NVMLError_DriverNotLoaded = ERROR_CLASSES["NVMLError_DriverNotLoaded"]
NVMLError_Unknown = ERROR_CLASSES["NVMLError_Unknown"]
NVMLError_Uninitialized = ERROR_CLASSES["NVMLError_Uninitialized"]
NVMLError_InvalidArgument = ERROR_CLASSES["NVMLError_InvalidArgument"]
NVMLError_FunctionNotFound = ERROR_CLASSES["NVMLError_FunctionNotFound"]

# The pynvml calls the sampler makes: the fake answers these and only these.
FUNCTIONS = (
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
)

GiB = 2**30


@dataclass
class FakeGpu:
    uuid: str
    name: str = "Fake H100 80GB HBM3"
    memory_used: int = 10 * GiB
    memory_total: int = 80 * GiB
    utilization: int = 50  # %
    memory_utilization: int = 20  # %
    temperature: int = 60  # °C
    power_mw: int = 300_000  # milliwatts, as NVML reports
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory bytes or None)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    as_bytes: bool = False  # UUID and name as bytes, as older pynvml returned them
    errors: dict[str, list] = field(default_factory=dict)  # call name -> [exception, times left or None]


class _Handle:
    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu


class FakeNvml(types.ModuleType):
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    def __init__(self, gpus=(), *, init_error: Exception | type | None = None):
        super().__init__("pynvml")
        for name, cls in ERROR_CLASSES.items():
            setattr(self, name, cls)
        self.gpus: list[FakeGpu] = list(gpus)
        self.init_error = init_error
        self.initialized = False
        self.count_error: Exception | type | None = None
        self.calls: list[str] = []

    # --- scripting ------------------------------------------------------------------------------
    def fail(self, index: int, call: str, error, times: int | None = None) -> None:
        assert call in FUNCTIONS, call
        self.gpus[index].errors[call] = [error, times]

    def heal(self, index: int) -> None:
        self.gpus[index].errors.clear()
        self.gpus[index].lost = False

    # --- pynvml ---------------------------------------------------------------------------------
    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error() if isinstance(self.init_error, type) else self.init_error
        self.initialized = True

    def nvmlShutdown(self):
        self.calls.append("nvmlShutdown")
        self._require_init()
        self.initialized = False

    def nvmlDeviceGetCount(self):
        self.calls.append("nvmlDeviceGetCount")
        self._require_init()
        if self.count_error is not None:
            raise self.count_error() if isinstance(self.count_error, type) else self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append("nvmlDeviceGetHandleByIndex")
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        self._check(gpu, "nvmlDeviceGetHandleByIndex")
        return _Handle(gpu)

    def nvmlDeviceGetUUID(self, handle):
        gpu = self._device(handle, "nvmlDeviceGetUUID")
        return gpu.uuid.encode() if gpu.as_bytes else gpu.uuid

    def nvmlDeviceGetName(self, handle):
        gpu = self._device(handle, "nvmlDeviceGetName")
        return gpu.name.encode() if gpu.as_bytes else gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle):
        gpu = self._device(handle, "nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=gpu.utilization, memory=gpu.memory_utilization)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        gpu = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._device(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return _processes(self._device(handle, "nvmlDeviceGetComputeRunningProcesses").compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return _processes(self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses").graphics)

    # --- internals ------------------------------------------------------------------------------
    def _require_init(self):
        if not self.initialized:
            raise NVMLError_Uninitialized()

    def _device(self, handle, call: str) -> FakeGpu:
        self.calls.append(call)
        self._require_init()
        assert isinstance(handle, _Handle), f"{call} needs a handle from nvmlDeviceGetHandleByIndex, got {handle!r}"
        self._check(handle.gpu, call)
        return handle.gpu

    def _check(self, gpu: FakeGpu, call: str) -> None:
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        scripted = gpu.errors.get(call)
        if scripted is None:
            return
        error, times = scripted
        if times is not None:
            if times <= 0:
                del gpu.errors[call]
                return
            scripted[1] = times - 1
        raise error() if isinstance(error, type) else error


def _processes(entries):
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in entries]
