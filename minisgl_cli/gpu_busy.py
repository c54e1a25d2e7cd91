"""How much of a benchmark run the GPU spent executing kernels, from the driver's own utilization samples.

NVML (libnvidia-ml, which ships with the driver: no package needed, read through ctypes) keeps a sample of "GPU
utilization" every sample period (200 ms on an H100): the percent of that period in which any kernel ran. `GpuBusy`
notes the wall clock around a run and collects the samples taken inside it: a thread reads the new ones every 2 s,
since the driver keeps only the last 72 (14 s on an H100), and the run itself is not touched. An engine that keeps the
GPU fed reads ~100%; one that leaves it idle between steps while its host works reads less, which is what tells a
host-bound run from a GPU-bound one when two engines are compared on a machine. Off CUDA, or where NVML cannot be
loaded, the share is None."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

_GPU_UTILIZATION_SAMPLES = 1  # nvmlSamplingType_t
_SUCCESS = 0


class _Value(ctypes.Union):  # nvmlValue_t
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
    ]


class _Sample(ctypes.Structure):  # nvmlSample_t
    _fields_ = [("timeStamp", ctypes.c_ulonglong), ("sampleValue", _Value)]


_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}  # nvmlValueType_t
_nvml: Any = None  # the loaded library once nvmlInit succeeded; False if it cannot be loaded here


def _library() -> Any:
    global _nvml
    if _nvml is None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            _nvml = lib if lib.nvmlInit_v2() == _SUCCESS else False
        except OSError:
            _nvml = False
    return _nvml


def _handle(device: Any) -> ctypes.c_void_p | None:
    """NVML's handle for a torch CUDA device, found by UUID (NVML numbers GPUs without CUDA_VISIBLE_DEVICES)."""
    import torch

    lib = _library()
    if not lib or getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    handle = ctypes.c_void_p()
    name = (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}").encode()
    return handle if lib.nvmlDeviceGetHandleByUUID(name, ctypes.byref(handle)) == _SUCCESS else None


def _samples(handle: ctypes.c_void_p, since_us: int) -> list[tuple[int, float]]:
    """The device's GPU-utilization samples newer than `since_us` (microseconds since the epoch, as NVML stamps
    them): (time stamp, percent) pairs; empty where NVML has none or cannot be read."""
    lib = _library()
    kind, count = ctypes.c_int(), ctypes.c_uint()
    since = ctypes.c_ulonglong(since_us)
    if lib.nvmlDeviceGetSamples(handle, _GPU_UTILIZATION_SAMPLES, since, ctypes.byref(kind), ctypes.byref(count), None):
        return []
    buf = (_Sample * count.value)()
    if lib.nvmlDeviceGetSamples(handle, _GPU_UTILIZATION_SAMPLES, since, ctypes.byref(kind), ctypes.byref(count), buf):
        return []
    field = _VALUE_FIELD.get(kind.value)
    return [(s.timeStamp, float(getattr(s.sampleValue, field))) for s in buf[: count.value]] if field else []


class GpuBusy:
    """`with GpuBusy(device) as busy: run()`, then `busy.share`: the mean of NVML's utilization samples taken during
    the run, as a fraction (None off CUDA, without NVML, or for a run shorter than one sample period)."""

    def __init__(self, device: Any, poll_s: float = 2.0):
        self.handle = _handle(device)
        self.poll_s = poll_s
        self.share: float | None = None
        self.samples = 0
        self._seen: dict[int, float] = {}  # time stamp -> percent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _collect(self) -> None:
        assert self.handle is not None
        self._seen.update(_samples(self.handle, max(self._seen, default=self.start_us)))

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._collect()

    def __enter__(self) -> GpuBusy:
        self.start_us = time.time_ns() // 1000
        if self.handle is not None:
            self._thread = threading.Thread(target=self._poll, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        end_us = time.time_ns() // 1000
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._collect()
        self.samples, self.share = share_inside(self._seen, self.start_us, end_us)


def share_inside(seen: dict[int, float], start_us: int, end_us: int) -> tuple[int, float | None]:
    """(count, mean fraction) of the samples whose whole period lies inside [start_us, end_us]. A sample is stamped
    at the end of its period, so the first one after the start also covers time before it (in a GPU test, 89% read
    for a GPU fed throughout: nine samples at ~99% and one straddling the idle start); the period is the samples'
    own spacing. With a single sample the period is unknown and it counts as it is."""
    stamps = sorted(ts for ts in seen if ts <= end_us)
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    period = gaps[len(gaps) // 2] if gaps else 0
    inside = [seen[ts] for ts in stamps if ts - period >= start_us]
    return len(inside), (sum(inside) / len(inside) / 100 if inside else None)
