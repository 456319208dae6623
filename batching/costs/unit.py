"""The step clock: a cost model in which every step takes one nominal second.

A run on it counts steps, not seconds: arrivals placed at step counts fall at the same point
of the schedule on a fast machine, a slow one or a busy one. The real engine's
:class:`~batching.real.executor.StepClock` advances the engine by :data:`STEP_S` per step in
the same way while it measures each step, so a simulation on :class:`UnitStep` predicts the
schedule a step-clock run takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..plan import StepWork

#: The nominal duration of one step on the step clock (s).
STEP_S = 1.0


class UnitStep:
    """Every step takes :data:`STEP_S`; no model, so no FLOPs and no utilization."""

    peak_flops = bandwidth = 0.0
    model = None

    def step_time(self, work: StepWork) -> float:
        return STEP_S

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray:
        return np.full(k, STEP_S)

    def describe(self) -> dict[str, Any]:
        return {"kind": "one second per step"}
