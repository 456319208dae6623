"""Small, hand-checkable pieces for the scheduler tests, and the benchmark scripts as modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

from batching.costs import get_cost_model
from batching.engine import SimExecutor
from batching.plan import StepWork
from batching.request import Request
from batching.workloads import Workload, synthetic
from batching.workloads.lengths import LogNormal


class LinearCost:
    """step time = base + per_token x tokens in the pass: easy to compute by hand."""

    peak_flops = 0.0
    bandwidth = 0.0
    model = None  # no FLOPs or bytes: no hardware utilization reported

    def __init__(self, base: float = 1.0, per_token: float = 0.0) -> None:
        self.base, self.per_token = base, per_token

    def step_time(self, w: StepWork) -> float:
        return float(self._t(np.array([w.tokens], dtype=float))[0])

    def _t(self, tokens: np.ndarray) -> np.ndarray:
        return self.base + self.per_token * tokens

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray:
        return self._t(np.full(k, rows, dtype=float))

    def flops(self, w: StepWork) -> float:
        return 0.0

    def bytes_moved(self, w: StepWork) -> float:
        return 0.0

    def describe(self) -> dict:
        return {"cost": "linear", "base": self.base, "per_token": self.per_token}


def reqs(*spec: tuple[float, int, int]) -> list[Request]:
    """Requests from (arrival, prompt_len, output_len) triples."""
    return [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the scripts are not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _texts(ax) -> dict:
    return {t.get_text(): t for t in ax.texts}


def _gpu_profile() -> dict:
    """A made-up H200 profile of llama-8b (schema 1), as a later session might commit."""
    return {
        "schema": 1,
        "meta": {
            "device": "H200-SXM",
            "device_name": "NVIDIA H200",
            "model": "llama-8b",
            "dtype": "bf16",
            "date": "2026-12-01T00:00:00+00:00",
        },
        "device": {"bandwidth": {"matvec": {"GBps_best": 4200.0}}, "matmul_peak": {"TFLOPs_best": 700.0}},
        "decode": {
            "batch": [1, 8, 64, 256],
            "ctx": [128, 1024],
            "ms": [[4.0, 4.2], [4.1, 4.6], [4.6, 8.0], [8.0, 20.0]],
        },
        "prefill": {"tokens": [128, 1024], "ms": [6.0, 30.0]},
    }


#: One second per step, whatever it holds: step counts read as seconds (scheduler and metric tests).
UNIT = SimExecutor(LinearCost(1.0))
#: The book's hero setup on the roofline: llama-8b in bf16 on one H100-SXM.
H100_8B = get_cost_model("llama-8b", "h100")


def small_trace(n: int = 120, rate: float = 8.0, seed: int = 3) -> Workload:
    """A long-tailed synthetic workload, small enough for unit tests."""
    return synthetic(
        n,
        rate,
        LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=800),
        seed=seed,
    )
