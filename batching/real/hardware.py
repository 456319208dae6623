"""Which device a real run uses, what it is (:func:`machine`), its registry entry (a GPU the
registry lacks: figures measured in the same run, :func:`measured_spec`) and its free memory."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..costs.base import MEM_RESERVE
from ..costs.devices import CPU_ENTRY, DeviceSpec, Machine

#: Substring of torch.cuda.get_device_name() -> registry device (the SXM parts' datasheets).
CUDA_NAMES: tuple[tuple[str, str], ...] = (("H200", "H200-SXM"), ("H100", "H100-SXM"), ("A100", "A100-SXM"))


class DeviceError(ValueError):
    """A device the run cannot use."""


class DeviceMemoryError(MemoryError):
    """The weights or the KV slabs would not fit the device's free memory."""


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for this process (None: leave them as they are)."""
    if threads is not None:
        torch.set_num_threads(threads)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when present, else the CPU. A CUDA device this torch cannot use raises
    :class:`DeviceError` saying why (not an ``AssertionError`` at the first allocation)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device={device!r}: {e}") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise DeviceError(
                f"device={device!r}: this torch ({torch.__version__}) is built without CUDA; "
                "install a CUDA build of PyTorch or use --device cpu"
            )
        n = torch.cuda.device_count()
        if n == 0 or not torch.cuda.is_available():
            raise DeviceError(f"device={device!r}: torch sees no CUDA GPU on this machine; use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise DeviceError(f"device={device!r}: this machine has {n} CUDA GPU(s), 0..{n - 1}")
    elif dev.type != "cpu":
        raise DeviceError(f"device={device!r}: real runs use cpu or cuda")
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued kernels."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _proc(path: str, key: str) -> str | None:
    """The value after the first line of ``path`` starting ``key`` (a /proc file), or None."""
    try:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), None)
    except OSError:
        return None


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _proc("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def cpu_flags() -> str:
    """The CPU flags that change which kernel wins (sorted), from /proc/cpuinfo."""
    want = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "avx_vnni")
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        line = ""
    have = set(line.split(":", 1)[-1].split())
    return ",".join(sorted(set(want) & have))


def machine(device: torch.device) -> Machine:
    """What ``device`` is, now: a GPU's name, or the CPU's model name with the threads torch
    uses (a profile measured with 2 threads does not price a run with 8) and the flags that
    change which kernel wins (two "AMD EPYC"s, one with AVX-512 BF16 and one with AVX2 only,
    run bf16 7x apart)."""
    if device.type == "cuda":
        return Machine("cuda", device_name(device))
    return Machine("cpu", device_name(device), torch.get_num_threads(), cpu_flags())


@dataclass(frozen=True)
class DeviceEntry:
    """``name`` files profiles and results (``H200-SXM``, ``cpu-here``, or an unregistered GPU's
    slug, ``nvidia-geforce-rtx-4090``); ``device_name`` is torch's; ``datasheet``: registered GPU."""

    name: str
    device_name: str
    datasheet: bool

    @property
    def registered(self) -> bool:
        """The registry has an entry of this name."""
        return self.datasheet or self.name == CPU_ENTRY


def entry_for(device_type: str, name: str) -> DeviceEntry:
    """The registry entry of a ``cpu`` or ``cuda`` device called ``name``."""
    if device_type == "cpu":
        return DeviceEntry(CPU_ENTRY, name, False)
    upper = name.upper()
    for key, reg in CUDA_NAMES:
        if key in upper:
            return DeviceEntry(reg, name, True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"
    return DeviceEntry(slug, name, False)


def device_entry(device: torch.device) -> DeviceEntry:
    """The registry entry of ``device``; never raises for a GPU."""
    return entry_for(device.type, device_name(device))


def measured_spec(
    entry: DeviceEntry, bandwidth: dict[str, Any], peak: dict[str, Any], dtype: str, mem_bytes: float
) -> dict[str, Any]:
    """``DeviceSpec``'s fields of an unregistered device from the bandwidth and peak measured in
    the same run (``meta.device_spec``); overhead and interconnect unmeasured: zero."""
    spec = DeviceSpec(
        entry.name,
        mem_bytes=float(mem_bytes),
        bandwidth=float(bandwidth["matvec"]["GBps_best"]) * 1e9,
        peak_flops={dtype: float(peak["TFLOPs_best"]) * 1e12},
        step_overhead_s=0.0,
        link_bandwidth=0.0,
        allreduce_latency_s=0.0,
        source=(
            f"measured in this run on {entry.device_name} "
            f"({dt.datetime.now(dt.timezone.utc).date().isoformat()}): best matrix-vector read "
            f"bandwidth, {peak['n']}^3 matmul; no datasheet entry"
        ),
    )
    d = asdict(spec)
    d["peak_flops"], d["notes"] = dict(spec.peak_flops), dict(spec.notes)
    return d


def device_memory(device: torch.device) -> float | None:
    """The device's total memory in bytes (GPU), or the machine's (CPU); None if unknown."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` now, or None if the platform does not say (nothing is checked).
    CUDA: the driver's free bytes plus the caching allocator's unused ones, which
    ``mem_get_info`` counts as taken (~30 GB after an 8B bandwidth probe)."""
    if device.type == "cuda":
        free = int(torch.cuda.mem_get_info(device)[0])
        cached = int(torch.cuda.memory_reserved(device)) - int(torch.cuda.memory_allocated(device))
        return free + max(cached, 0)
    if (kb := _proc("/proc/meminfo", "MemAvailable:")) is not None:
        return int(kb.split()[0]) * 1024
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(needed: int, available: int | None, what: str, device: torch.device) -> None:
    """Raise :class:`DeviceMemoryError` unless ``needed`` fits ``1 - MEM_RESERVE`` of ``available``."""
    if available is None:
        return
    usable = int(available * (1 - MEM_RESERVE))
    if needed > usable:
        raise DeviceMemoryError(
            f"{what} needs {needed / 1e9:.2f} GB (needed={needed:,} bytes) but {device} has "
            f"{available / 1e9:.2f} GB available (available={available:,} bytes, "
            f"{1 - MEM_RESERVE:.0%} of it usable): use fewer slots, a smaller max_len or a smaller model"
        )
