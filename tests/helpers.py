"""Small, hand-checkable pieces for the scheduler tests, and the benchmark scripts as modules."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

from batching.plan import StepWork
from batching.request import Request


class LinearCost:
    """step time = base + per_token x tokens in the pass: easy to compute by hand."""

    peak_flops = 0.0
    bandwidth = 0.0

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
