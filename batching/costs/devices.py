"""Named devices for the roofline cost model. Every constant names its source: a datasheet,
a measurement on this project's CPU, or, for step overheads and all-reduce latency, an
assumption stated as one. :class:`Machine` is what a measured device was, which the registry's
one CPU entry cannot tell."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .models import canonical_dtype


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or the CPU this project runs on).

    ``bandwidth`` is memory read bandwidth in bytes/s; ``peak_flops`` maps a dtype to dense
    (no sparsity) FLOP/s; ``step_overhead_s`` is the fixed cost of one engine step
    (launches, scheduling, sampling); ``link_bandwidth`` is the per-direction bytes/s of one
    device's tensor-parallel interconnect, ``allreduce_latency_s`` the fixed cost of one
    all-reduce. ``mem_bytes`` is the memory the datasheet states.
    """

    name: str
    mem_bytes: float
    bandwidth: float
    peak_flops: Mapping[str, float]
    step_overhead_s: float
    link_bandwidth: float
    allreduce_latency_s: float
    source: str
    notes: Mapping[str, float] = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; ValueError if the device has no such math."""
        d = canonical_dtype(dtype)
        if d not in self.peak_flops:
            raise ValueError(f"{self.name} has no {d} peak; it has: {', '.join(self.peak_flops)}")
        return self.peak_flops[d]


# Assumption, not a measurement: a vLLM-style engine with CUDA graphs spends a few hundred
# microseconds per step outside the kernels (scheduling, input preparation, sampling); eager
# PyTorch would add launches per layer on top (milliseconds for 70B). Commonly quoted, not
# benchmarked here.
_GPU_STEP_OVERHEAD_S = 300e-6
# Assumption: a small-message all-reduce over NVLink costs about 10 us (the order nccl-tests
# reports for 2-8 GPUs at small sizes; vLLM's custom all-reduce is somewhat faster).
_NVLINK_ALLREDUCE_S = 10e-6

_A100_SRC = (
    "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): 80 GB HBM2e, 2,039 GB/s, "
    "BF16 312 TFLOPS dense (624 with sparsity), FP32 19.5 TFLOPS, NVLink 600 GB/s"
)
_H100_SRC = (
    "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 80 GB HBM3, 3.35 TB/s, "
    "BF16 1,979 / FP8 3,958 TFLOPS with sparsity = 989 / 1,979 dense, FP32 67 TFLOPS, "
    "NVLink 900 GB/s"
)
_H200_SRC = (
    "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, "
    "BF16 989 / FP8 1,979 TFLOPS dense (same compute as H100 SXM), FP32 67 TFLOPS, "
    "NVLink 900 GB/s"
)
_CPU_SRC = (
    "measured here before the project started: AMD EPYC (Zen 3) 2 vCPU, AVX2+FMA, "
    "torch 2.13.0+cpu, 2 threads, state 2026-11: MKL fp32 matrix-vector 18.5 GB/s (copy "
    "32 GB/s read+write, sum 35 GB/s), fp32 ~110 GFLOP/s, a Llama-style decoder of 26.4M params "
    "14.7 ms per batch-1 decode step; memory from /proc/meminfo"
)


def _sxm(name: str, mem: float, bw: float, peaks: dict[str, float], nvlink: float, src: str) -> DeviceSpec:
    # NVLink figures are bidirectional totals per GPU; a ring all-reduce is limited by one
    # direction, so link_bandwidth is half of them.
    return DeviceSpec(name, mem, bw, dict(peaks), _GPU_STEP_OVERHEAD_S, nvlink / 2, _NVLINK_ALLREDUCE_S, src)


#: The registry entry every CPU's profiles and results are filed under, whatever the CPU.
CPU_ENTRY = "cpu-here"
_HOPPER = {"bf16": 989e12, "fp8": 1979e12, "fp32": 67e12}
DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        # Datasheet "GB" is decimal; nvidia-smi reports ~81.5 GiB on an 80 GB part, so memory
        # checks err on the safe side by a few percent.
        _sxm("A100-SXM", 80e9, 2.039e12, {"bf16": 312e12, "fp32": 19.5e12}, 600e9, _A100_SRC),
        _sxm("H100-SXM", 80e9, 3.35e12, _HOPPER, 900e9, _H100_SRC),
        _sxm("H200-SXM", 141e9, 4.8e12, _HOPPER, 900e9, _H200_SRC),
        # bandwidth: MKL fp32 matrix-vector, the best rate a decode step's weight reads reach
        # (copy 32 GB/s read+write and sum 35 GB/s are kept in notes as the other references).
        # peak ~110 GFLOP/s fp32, so B* = 2 x 110 / 18.5 ~ 12 (7 against the copy bandwidth;
        # MKL's small-batch kernels put the observed knee at ~4).
        # step_overhead_s: config S at batch 1 takes 14.7 ms for 105 MB of weights (5.7 ms at
        # 18.5 GB/s): ~9 ms of Python/dispatch per step. M and L sit 13-22 ms above the
        # roofline, so for them it is a lower bound. No interconnect: tp must stay 1.
        DeviceSpec(
            CPU_ENTRY,
            mem_bytes=25.3e9,
            bandwidth=18.5e9,
            peak_flops={"fp32": 110e9},
            step_overhead_s=9e-3,
            link_bandwidth=0.0,
            allreduce_latency_s=0.0,
            source=_CPU_SRC,
            notes={"copy_bandwidth": 32e9, "sum_bandwidth": 35e9, "matvec_bandwidth": 18.5e9},
        ),
    )
}

_ALIASES: dict[str, str] = {"a100": "A100-SXM", "h100": "H100-SXM", "h200": "H200-SXM", "cpu": CPU_ENTRY}


def get_device(name: str) -> DeviceSpec:
    """The device called ``name`` or an alias (``h100``, ``h200``, ``a100``, ``cpu``), any case."""
    key = str(name).lower()
    canon = _ALIASES.get(key) or next((n for n in DEVICES if n.lower() == key), None)
    if canon is None:
        raise ValueError(
            f"unknown device {name!r}; valid: {', '.join(DEVICES)} (aliases: {', '.join(_ALIASES)})"
        )
    return DEVICES[canon]


@dataclass(frozen=True)
class Machine:
    """What a measured device is, recorded as ``machine`` beside every profile's and real run's
    ``device`` (the registry entry, which files every CPU as :data:`CPU_ENTRY`): a CPU's model
    name and the threads torch ran on, or a GPU's name. Two records are of one machine only
    when all of these agree: a CPU's speed depends on its threads as much as on its model."""

    kind: str  # "cpu" or "cuda"
    name: str
    threads: int | None = None  # a CPU's torch threads; None for a GPU (or where unrecorded)
    # A CPU's flags that change which kernel wins (avx2, avx512f, avx512_bf16, amx_bf16, ...,
    # sorted, comma-separated); None for a GPU, or in a file written before they were recorded,
    # which is then never this machine's: CPUs of one model name differ by them.
    flags: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (``meta.machine``): a GPU's has no threads or flags."""
        d: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == "cpu":
            d["threads"] = self.threads
            if self.flags is not None:
                d["flags"] = self.flags
        return d

    @property
    def label(self) -> str:
        """The machine as tables and legends name it: ``AMD EPYC (2 threads, AVX2)``,
        ``NVIDIA H200`` (parentheses, not a comma: labels are listed with commas); a record
        without flags shows none."""
        if self.kind != "cpu" or self.threads is None:
            return self.name
        isa = next((n for f, n in _ISA if f in (self.flags or "").split(",")), None)
        return f"{self.name} ({self.threads} thread{'' if self.threads == 1 else 's'}{f', {isa}' if isa else ''})"


#: How a label names a CPU's widest vector unit, from its flags (the first that it has).
_ISA = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def machine_of(record: Mapping[str, Any]) -> Machine | None:
    """The :class:`Machine` of a profile's ``meta``, a sweep's ``meta``, a real executor's record
    or a benchmark's result: its ``machine``, or, in files written before that key, the
    ``device_name`` and ``threads`` beside the entry (``device_type``, else a ``device`` of
    ``cpu...`` or :data:`CPU_ENTRY`, says a CPU). None where the record names no device."""
    m = record.get("machine")
    if isinstance(m, Mapping):
        cpu = m["kind"] == "cpu"
        threads, flags = (m.get("threads"), m.get("flags")) if cpu else (None, None)
        return Machine(
            str(m["kind"]),
            str(m["name"]),
            None if threads is None else int(threads),
            None if flags is None else str(flags),
        )
    name = record.get("device_name")
    if not name:
        return None
    device = str(record.get("device", ""))
    kind = str(
        record.get("device_type") or ("cpu" if device == CPU_ENTRY or device.startswith("cpu") else "cuda")
    )
    threads = record.get("threads") if kind == "cpu" else None
    return Machine(kind, str(name), None if threads is None else int(threads))


def same_machine(a: Machine | None, b: Machine | None) -> bool:
    """Whether two measurements ran on one machine (kind, name, a CPU's threads and flags); an
    unrecorded one is never the same (a page must not call another machine's file this
    machine's), nor a CPU without recorded flags the same as one with them."""
    return a is not None and b is not None and a == b
