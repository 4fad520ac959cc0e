"""The resource sampler against a fake NVML installed at the pynvml import boundary (tests/fake_nvml.py)."""

from __future__ import annotations

import logging
import os
import sys

import psutil
import pytest

from agent.sampler import NvmlReader, ResourceSampler, sample_payload, to_payload
from ingest.schemas import parse_resource_sample
from tests.fake_nvml import (FUNCTIONS, GiB, FakeGpu, FakeNvml, NVMLError_DriverNotLoaded, NVMLError_GpuIsLost,
                             NVMLError_LibraryNotFound, NVMLError_NoPermission, NVMLError_NotSupported,
                             NVMLError_Unknown)

AGENT_LOG = "tracedash.agent"


def _gpus():
    return [
        FakeGpu("GPU-aaaa", "Fake H100 80GB HBM3", memory_used=70 * GiB, memory_total=80 * GiB, utilization=97,
                temperature=71, power_mw=350_500, compute=[(4242, 60 * GiB)]),
        FakeGpu("GPU-bbbb", "Fake A100-SXM4-40GB", memory_used=10 * GiB, memory_total=40 * GiB, utilization=3,
                temperature=38, power_mw=61_000),
        FakeGpu("GPU-cccc", "Fake L4", memory_used=0, memory_total=24 * GiB, utilization=0, temperature=30,
                power_mw=16_250, as_bytes=True),
    ]


@pytest.fixture
def fake(monkeypatch):
    nvml = FakeNvml(_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def _agent_records(caplog, level=logging.INFO):
    return [r for r in caplog.records if r.name == AGENT_LOG and r.levelno >= level]


def _gpu_rows(rows):
    return {row["gpu_uuid"]: row for row in rows if row["gpu_index"] >= 0}


def test_several_gpus_are_sampled_with_every_figure(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sampler = ResourceSampler(host="gpu-host-1")
    rows = sampler.sample()
    assert [r["gpu_index"] for r in rows] == [-1, 0, 1, 2]
    assert {r["time"] for r in rows} == {rows[0]["time"]} and {r["host"] for r in rows} == {"gpu-host-1"}

    host = rows[0]
    assert 0 <= host["cpu_percent"] <= 100
    memory = psutil.virtual_memory()
    assert host["memory_total"] == memory.total and 0 < host["memory_used"] <= host["memory_total"]
    assert host["gpu_utilization"] is None and host["gpu_memory_used"] is None and host["gpu_uuid"] == ""

    gpus = _gpu_rows(rows)
    h100, a100, l4 = gpus["GPU-aaaa"], gpus["GPU-bbbb"], gpus["GPU-cccc"]
    assert h100["gpu_name"] == "Fake H100 80GB HBM3" and h100["gpu_index"] == 0
    assert h100["gpu_memory_used"] == 70 * GiB and h100["gpu_memory_total"] == 80 * GiB
    assert h100["gpu_memory_used"] / h100["gpu_memory_total"] == pytest.approx(0.875)  # GPU memory % = used / total
    assert a100["gpu_memory_used"] / a100["gpu_memory_total"] == pytest.approx(0.25)
    assert l4["gpu_memory_used"] == 0 and l4["gpu_memory_total"] == 24 * GiB  # 0 measured is 0, not missing
    assert (h100["gpu_utilization"], a100["gpu_utilization"], l4["gpu_utilization"]) == (97.0, 3.0, 0.0)
    assert (h100["gpu_temperature"], a100["gpu_temperature"]) == (71.0, 38.0)
    assert h100["gpu_power_watts"] == pytest.approx(350.5) and l4["gpu_power_watts"] == pytest.approx(16.25)
    assert l4["gpu_name"] == "Fake L4"  # bytes from an older pynvml are decoded
    assert h100["process_pids"] == [4242] and h100["process_gpu_memory"] == [60 * GiB]
    assert a100["process_pids"] == [] and all(r["cpu_percent"] is None for r in gpus.values())  # never 0
    assert _agent_records(caplog, logging.WARNING) == []
    assert set(fake.calls) <= set(FUNCTIONS) and "nvmlInit" in fake.calls
    sampler.close()
    assert fake.calls[-1] == "nvmlShutdown"


def test_the_payload_is_what_the_api_takes(fake):
    rows = ResourceSampler(host="gpu-host-1").sample()
    payload = to_payload(rows)
    assert list(payload) == ["samples"] and len(payload["samples"]) == 4
    host, h100 = payload["samples"][0], payload["samples"][1]
    assert isinstance(host["time"], int) and host["time"] == rows[0]["time"]
    assert "gpu_utilization" not in host and "processes" not in host and "gpu_uuid" not in host  # None left out
    assert host["gpu_index"] == -1 and "cpu_percent" in host and "memory_total" in host
    assert "cpu_percent" not in h100 and "memory_used" not in h100
    assert h100["processes"] == [{"pid": 4242, "name": h100["processes"][0]["name"], "gpu_memory": 60 * GiB}]
    assert h100["gpu_power_watts"] == pytest.approx(350.5) and h100["gpu_uuid"] == "GPU-aaaa"
    import json

    for sample in payload["samples"]:  # the server's own validation accepts each one, figures intact
        stored = parse_resource_sample(json.dumps(sample).encode(), project_id=1)
        row = next(r for r in rows if r["gpu_index"] == sample["gpu_index"])
        for name in ("time", "host", "gpu_index", "gpu_uuid", "gpu_utilization", "gpu_memory_used", "gpu_memory_total",
                     "gpu_temperature", "gpu_power_watts", "memory_used", "memory_total", "process_pids",
                     "process_names", "process_gpu_memory"):
            assert stored[name] == row[name], name


def test_payload_bounds_labels_and_process_lists():
    row = {"time": 1_800_000_000 * 10**9, "host": "h" * 300, "gpu_index": 0, "gpu_uuid": "GPU-x", "gpu_name": "n" * 300,
           "gpu_utilization": None, "process_pids": list(range(1, 1101)), "process_names": ["p"] * 1100,
           "process_gpu_memory": list(range(1, 1101))}
    sample = sample_payload(row)
    assert len(sample["host"]) == 256 and len(sample["gpu_name"]) == 256 and "gpu_utilization" not in sample
    assert len(sample["processes"]) == 1024 and min(p["gpu_memory"] for p in sample["processes"]) == 77  # largest kept


def test_a_figure_the_gpu_does_not_support_is_missing_not_zero(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    fake.fail(1, "nvmlDeviceGetPowerUsage", NVMLError_NotSupported)
    fake.fail(1, "nvmlDeviceGetUtilizationRates", NVMLError_NotSupported)  # e.g. MIG mode
    fake.fail(2, "nvmlDeviceGetComputeRunningProcesses", NVMLError_NoPermission)  # e.g. in a container
    fake.gpus[2].graphics = [(77, GiB)]
    gpus = _gpu_rows(ResourceSampler(host="h").sample())
    assert len(gpus) == 3
    assert gpus["GPU-bbbb"]["gpu_power_watts"] is None and gpus["GPU-bbbb"]["gpu_utilization"] is None
    assert gpus["GPU-bbbb"]["gpu_memory_used"] == 10 * GiB and gpus["GPU-bbbb"]["gpu_temperature"] == 38.0
    assert gpus["GPU-cccc"]["process_pids"] == [77]  # graphics list still read
    assert _agent_records(caplog, logging.WARNING) == []


def test_a_gpu_failing_mid_sampling_is_skipped_with_a_warning_naming_it(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sampler = ResourceSampler(host="h")
    assert len(_gpu_rows(sampler.sample())) == 3
    fake.fail(1, "nvmlDeviceGetMemoryInfo", NVMLError_GpuIsLost)  # after handle, UUID and name were read
    caplog.clear()
    gpus = _gpu_rows(sampler.sample())
    assert sorted(gpus) == ["GPU-aaaa", "GPU-cccc"]  # the others are still sampled
    assert gpus["GPU-aaaa"]["gpu_memory_used"] == 70 * GiB
    warnings = _agent_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "GPU 1" in message and "GPU-bbbb" in message and "Fake A100-SXM4-40GB" in message and "GPU is lost" in message

    caplog.clear()
    assert sorted(_gpu_rows(sampler.sample())) == ["GPU-aaaa", "GPU-cccc"]
    assert _agent_records(caplog, logging.WARNING) == []  # a lasting failure is not repeated every sample

    fake.heal(1)
    caplog.clear()
    assert sorted(_gpu_rows(sampler.sample())) == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    assert [r.getMessage() for r in _agent_records(caplog)] == ["GPU 1 (Fake A100-SXM4-40GB, GPU-bbbb) readable again"]


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetTemperature",
                                  "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"])
def test_any_call_failing_skips_only_that_gpu(fake, caplog, call):
    caplog.set_level(logging.INFO, AGENT_LOG)
    fake.fail(0, call, NVMLError_Unknown, times=1)
    sampler = ResourceSampler(host="h")
    assert sorted(_gpu_rows(sampler.sample())) == ["GPU-bbbb", "GPU-cccc"]
    [warning] = _agent_records(caplog, logging.WARNING)
    assert warning.getMessage().startswith("GPU 0") and "Unknown Error" in warning.getMessage()
    assert sorted(_gpu_rows(sampler.sample())) == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]  # one bad read, then back


def test_a_gpu_lost_between_samples(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sampler = ResourceSampler(host="h")
    assert len(_gpu_rows(sampler.sample())) == 3
    fake.gpus[2].lost = True  # fell off the bus: every call on it fails
    caplog.clear()
    rows = sampler.sample()
    assert sorted(_gpu_rows(rows)) == ["GPU-aaaa", "GPU-bbbb"] and rows[0]["gpu_index"] == -1
    [warning] = _agent_records(caplog, logging.WARNING)
    assert "GPU 2 (Fake L4, GPU-cccc) skipped" in warning.getMessage() and "GPU is lost" in warning.getMessage()


def test_a_gpu_vanishing_from_the_count(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sampler = ResourceSampler(host="h")
    assert len(_gpu_rows(sampler.sample())) == 3
    del fake.gpus[1]  # the driver no longer lists it; NVML renumbers the rest
    caplog.clear()
    gpus = _gpu_rows(sampler.sample())
    assert sorted(gpus) == ["GPU-aaaa", "GPU-cccc"] and gpus["GPU-cccc"]["gpu_index"] == 1
    assert gpus["GPU-cccc"]["gpu_memory_total"] == 24 * GiB  # figures follow the GPU, not the index
    [warning] = _agent_records(caplog, logging.WARNING)
    assert "GPU 1 (Fake A100-SXM4-40GB, GPU-bbbb)" in warning.getMessage() and "no longer" in warning.getMessage()
    caplog.clear()
    sampler.sample()
    assert _agent_records(caplog, logging.WARNING) == []  # said once
    fake.gpus.append(FakeGpu("GPU-dddd", "Fake H200"))
    caplog.clear()
    assert sorted(_gpu_rows(sampler.sample())) == ["GPU-aaaa", "GPU-cccc", "GPU-dddd"]
    assert any("GPU-dddd" in r.getMessage() for r in _agent_records(caplog))


def test_nvml_failing_to_count_gives_host_rows_only(fake, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sampler = ResourceSampler(host="h")
    fake.count_error = NVMLError_DriverNotLoaded
    assert [r["gpu_index"] for r in sampler.sample()] == [-1]
    assert [r["gpu_index"] for r in sampler.sample()] == [-1]
    warnings = _agent_records(caplog, logging.WARNING)
    assert len(warnings) == 1 and "Driver Not Loaded" in warnings[0].getMessage()


@pytest.mark.parametrize("broken", ["init_error", "not_installed"])
def test_without_nvml_the_host_is_sampled_alone_with_one_log_line(monkeypatch, caplog, broken):
    caplog.set_level(logging.DEBUG, AGENT_LOG)
    if broken == "init_error":
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=NVMLError_LibraryNotFound))
    else:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    sampler = ResourceSampler(host="cpu-only")
    for _ in range(3):
        rows = sampler.sample()
        assert len(rows) == 1 and rows[0]["gpu_index"] == -1 and rows[0]["cpu_percent"] is not None
    sampler.close()
    records = _agent_records(caplog, logging.DEBUG)
    assert len(records) == 1, [r.getMessage() for r in records]
    message = records[0].getMessage()
    assert message.startswith("NVML unavailable") and "host CPU and memory only" in message
    assert ("NVML Shared Library Not Found" if broken == "init_error" else "nvidia-ml-py") in message


def test_processes_from_compute_and_graphics_are_deduplicated_by_pid(fake):
    me = os.getpid()
    fake.gpus[0].compute = [(me, 3 * GiB), (200, 2 * GiB), (400, None)]
    fake.gpus[0].graphics = [(me, 3 * GiB), (300, GiB // 2), (200, 2 * GiB + 4096)]
    gpu = _gpu_rows(ResourceSampler(host="h").sample())["GPU-aaaa"]
    assert gpu["process_pids"] == [me, 200, 300]  # 400: memory unknown to NVML, left out
    assert gpu["process_gpu_memory"] == [3 * GiB, 2 * GiB + 4096, GiB // 2]  # one entry per PID, never summed
    assert gpu["process_names"][0] == psutil.Process(me).name()
    assert sum(gpu["process_gpu_memory"]) <= gpu["gpu_memory_total"]


def test_nvml_reader_alone(fake):
    reader = NvmlReader()
    assert reader.available and reader.reason == ""
    [h100, a100, l4] = reader.sample()
    assert h100.memory_percent == pytest.approx(87.5) and a100.memory_percent == pytest.approx(25.0)
    assert l4.memory_percent == 0.0
    reader.close()
    assert not reader.available and reader.sample() == []


def test_host_cpu_percent_is_measured_over_a_real_window():
    class NoGpu:
        available, reason = False, "test"

        def sample(self):
            return []

    sampler = ResourceSampler(host="h", nvml=NoGpu(), min_cpu_window=0.05)
    values = [sampler.sample()[0]["cpu_percent"] for _ in range(3)]
    assert all(v is not None and 0.0 <= v <= 100.0 for v in values)


def test_calls_the_driver_lacks_fall_back_to_their_versioned_siblings(fake, caplog):
    """nvidia-ml-py's process lists call the _v3 functions, which older drivers lack (pynvml raises
    NVMLLibraryMismatchError, not an NVMLError); nvmlDeviceGetTemperature is to be removed for
    nvmlDeviceGetTemperatureV. Neither may cost the GPU its other figures."""
    from tests.fake_nvml import NVMLError_FunctionNotFound, NVMLLibraryMismatchError

    caplog.set_level(logging.INFO, AGENT_LOG)
    fake.gpus[0].graphics = [(7, GiB)]
    fake.fail(0, "nvmlDeviceGetComputeRunningProcesses", NVMLLibraryMismatchError("use a versioned function"))
    fake.fail(0, "nvmlDeviceGetTemperature", NVMLError_FunctionNotFound)
    sampler = ResourceSampler(host="h")
    h100 = _gpu_rows(sampler.sample())["GPU-aaaa"]
    assert h100["gpu_memory_used"] == 70 * GiB and h100["gpu_power_watts"] == pytest.approx(350.5)
    assert h100["gpu_temperature"] is None and h100["process_pids"] == [7]  # no sibling in this pynvml: missing

    fake.nvmlDeviceGetComputeRunningProcesses_v2 = lambda handle: [type("P", (), {"pid": 4242, "usedGpuMemory": 5})()]
    fake.nvmlDeviceGetTemperatureV = lambda handle, sensor: 66
    h100 = _gpu_rows(sampler.sample())["GPU-aaaa"]
    assert h100["gpu_temperature"] == 66.0 and h100["process_pids"] == [4242, 7]
    assert _agent_records(caplog, logging.WARNING) == []
