"""The real executor: the simulator's schedulers and engine loop (``engine.run``), each step
run on a torch model and timed by the wall clock instead of predicted."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..costs import RooflineCost
from ..costs.devices import get_device
from ..costs.models import ModelShape, get_model
from ..costs.unit import STEP_S
from ..engine import RunResult, StepResult, run
from ..plan import StepPlan
from ..request import Request, RequestError
from ..schedulers.base import Scheduler
from ..workloads import Workload
from .checkpoint import load_hf_checkpoint, read_config
from .hardware import device_entry, device_name, machine, resolve_device, set_threads, synchronize
from .kernels import DTYPES, LinearPlan, dtype_name, plan_for, torch_dtype
from .model import default_dtype
from .runner import ModelRunner, check_model_fits


def resolve_dtype(dtype: str | None, device: torch.device, shape: ModelShape | None = None) -> torch.dtype:
    """A dtype's name (``fp32``, ``bf16``, ``fp64``); ``None``: fp32 on CPU, bf16 on CUDA;
    ``auto``: bf16 on CUDA, on a CPU the faster for ``shape`` here (:func:`kernel_plan`)."""
    if dtype is None:
        return default_dtype(device)
    if str(dtype).lower() == "auto":
        if shape is None:
            raise ValueError("dtype='auto' needs the model's shape")
        return DTYPES[kernel_plan(shape, device, "auto").dtype]
    try:
        return torch_dtype(dtype)
    except ValueError:
        raise ValueError(f"dtype={dtype!r}: must be auto or one of {', '.join(DTYPES)}") from None


def kernel_plan(shape: ModelShape, device: torch.device, dtype: str | torch.dtype | None) -> LinearPlan:
    """The linear layers' plan of ``shape`` on ``device`` in ``dtype`` (``auto``: with the dtype
    chosen, and why): probed once per machine on a CPU (:mod:`batching.real.kernels`)."""
    if isinstance(dtype, str) and dtype.lower() != "auto":
        dtype = resolve_dtype(dtype, device)
    # A model whose weights fit in no dtype is refused before the probe allocates them.
    smallest = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
    check_model_fits(shape, 1, device, smallest, 1, graphs=False)
    return plan_for(shape, device, dtype)


def hardware_cost(runner: ModelRunner) -> RooflineCost | None:
    """The registry roofline behind hardware utilization (FLOPs, bytes, peak, bandwidth; never
    durations). None for an unknown GPU, float64 or a model of other sizes: none reported."""
    cfg, dt, entry = runner.cfg, dtype_name(runner.dtype), device_entry(runner.device)
    try:
        shape = get_model(cfg.name)
        keys = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied_embeddings")
        if dt is None or not entry.registered or any(getattr(shape, k) != getattr(cfg, k) for k in keys):
            return None
        return RooflineCost(shape.with_dtype(dt), get_device(entry.name))
    except ValueError:  # no such model; the device has no peak for this dtype, or can't fit it
        return None


class RealExecutor:
    """Runs each step plan on the model and reports its measured duration; the warm-up captures
    decode graphs up to ``graph_rows`` rows and ``graph_ctx`` positions (what the workload reaches)."""

    def __init__(
        self,
        runner: ModelRunner,
        warmup: bool = True,
        warmup_tokens: int = 0,
        graph_rows: int | None = None,
        graph_ctx: int | None = None,
    ) -> None:
        self.runner = runner
        self.device = runner.device
        self.utilization_basis = hardware_cost(runner)
        self.steps = 0
        self.warmup_s = 0.0
        if warmup:
            # A fresh process's one-off costs (several step times) and graph captures must not
            # show up as the first request's TTFT.
            t0 = time.perf_counter()
            runner.warmup(
                capture_graphs=True, tokens=warmup_tokens, graph_rows=graph_rows, graph_ctx=graph_ctx
            )
            synchronize(self.device)
            self.warmup_s = time.perf_counter() - t0

    def execute(self, plan: StepPlan) -> StepResult:
        """One forward pass; duration in seconds."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            tokens = self.runner.execute(plan)  # ends in .tolist(): the host waits for the tokens
            end.record()
            end.synchronize()
            duration = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            tokens = self.runner.execute(plan)
            duration = time.perf_counter() - t0
        self.steps += 1
        return StepResult(duration=duration, token_ids=tokens)

    def decode_run(self, plan: StepPlan, k: int) -> None:
        """No fast path: every real step runs."""
        return None

    def describe(self) -> dict[str, Any]:
        """What ran: the results file's executor record (``machine``: what the device is, which
        the pages compare with a profile's before calling it this machine's)."""
        r = self.runner
        return {
            "executor": "real",
            "model": r.cfg.name,
            "params": r.model.num_params(),
            "dtype": str(r.dtype).removeprefix("torch."),
            "device": str(r.device),
            "device_name": device_name(r.device),
            "machine": machine(r.device).to_dict(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "linear": r.model.linear_form,
            "kernels": r.model.kernels.to_dict(),
            "form_copy_bytes": r.model.forms_bytes(),
            "decode_graphs": r.graphs_info(),
            "attention": r.attention_backends(),
            "slots": r.slots,
            "max_len": r.max_len,
            "kv_cache_bytes": r.cache.nbytes,
            "seed": r.seed,
            "rope_theta": r.cfg.rope_theta,
            "warmup_s": self.warmup_s,
            "hardware": None if self.utilization_basis is None else self.utilization_basis.device.name,
        }


class StepClock:
    """Wraps an executor so that the engine's clock advances one nominal second per step while
    the wrapped executor measures each real step (``measured``). Arrivals then fall on step
    counts, the same on a fast machine, a slow one or a busy one; :func:`retime` puts the
    measured seconds back into the finished run."""

    def __init__(self, inner: RealExecutor) -> None:
        self.inner = inner
        self.measured: list[float] = []

    @property
    def utilization_basis(self) -> RooflineCost | None:
        return self.inner.utilization_basis

    def execute(self, plan: StepPlan) -> StepResult:
        res = self.inner.execute(plan)
        self.measured.append(res.duration)
        return StepResult(duration=STEP_S, token_ids=res.token_ids)

    def decode_run(self, plan: StepPlan, k: int) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "clock": "steps"}


def retime(result: RunResult, measured: Sequence[float]) -> RunResult:
    """A run on the :class:`StepClock` (step ``j`` from ``j`` to ``j + 1`` nominal seconds),
    moved onto the measured clock: every time ``x`` becomes the measured time at that point
    of the steps, linear within a step. Changes ``result`` in place and returns it; refuses a
    run that idled between steps (its gap has no measured length)."""
    log = result.log.cols
    n = len(measured)
    if log["t"] != [float(j) for j in range(n)] or any(k != 1 for k in log["n"]):
        raise ValueError("retime: the run is not back to back on the step clock (it idled between steps)")
    ends = np.concatenate([[0.0], np.cumsum(np.asarray(measured, dtype=np.float64))])
    grid = np.arange(n + 1, dtype=np.float64)

    def at(x: Any) -> Any:
        return np.interp(x, grid, ends)

    log["t"] = ends[:-1].tolist()
    log["dur"] = [float(d) for d in measured]
    for r in result.requests:
        r.arrival = float(at(r.arrival))
        r.admit_time = None if r.admit_time is None else float(at(r.admit_time))
        r.finish_time = None if r.finish_time is None else float(at(r.finish_time))
        r.token_times = at(np.asarray(r.token_times)).tolist()
    return result


def run_real(
    workload_requests: Workload | Iterable[Request],
    scheduler: Scheduler,
    model_name: str | None,
    device: str | torch.device = "auto",
    dtype: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    max_len: int | None = None,
    checkpoint: str | Path | None = None,
    runner: ModelRunner | None = None,
    graphs: bool | None = None,
    step_clock: bool = False,
    **run_kw: Any,
) -> RunResult:
    """Serve a workload with ``scheduler`` on a real model; ``run_kw`` go to ``engine.run``.

    Requests stop at their trace output length (EOS ignored, as vLLM's benchmark does).
    ``threads``: torch's intra-op threads. ``max_len``: each slot's slab (longer requests are
    refused up front). ``checkpoint``: a Hugging Face Llama checkpoint (shape and weights);
    ``runner``: an existing model and cache, shared between runs. With either, ``model_name``
    may be None, else must match. ``graphs``: CUDA-graph decode (default on CUDA).
    ``step_clock``: arrival times count engine steps, not seconds (:class:`StepClock`); the
    result is on the measured clock all the same."""
    reqs = workload_requests.fresh() if isinstance(workload_requests, Workload) else list(workload_requests)
    if runner is not None:
        if device != "auto" or any(x is not None for x in (checkpoint, dtype, max_len, graphs)):
            raise ValueError(
                "run_real(runner=...) takes its model, device, dtype, max_len and graphs from the "
                "runner: pass none of checkpoint, device, dtype, max_len, graphs"
            )
        if model_name is not None and model_name != runner.cfg.name:
            raise ValueError(f"model {model_name!r} but the runner holds {runner.cfg.name!r}")
        if runner.slots < scheduler.max_slots:
            raise ValueError(
                f"the runner has slots={runner.slots} but the scheduler uses max_slots={scheduler.max_slots}"
            )
        limit = runner.max_len
    else:
        shape: ModelShape
        if checkpoint is not None:
            shape = read_config(checkpoint)
            if model_name is not None and model_name != shape.name:
                raise ValueError(f"model {model_name!r} but the checkpoint {checkpoint} holds {shape.name!r}")
        elif model_name is None:
            raise ValueError("run_real needs a model name or a checkpoint")
        else:
            shape = get_model(model_name)
        dev = resolve_device(device)
        plan = kernel_plan(shape, dev, dtype) if str(dtype).lower() == "auto" else None
        dt = DTYPES[plan.dtype] if plan is not None else resolve_dtype(dtype, dev)
        limit = shape.max_context if max_len is None else max_len
    set_threads(threads)
    for r in reqs:
        if r.prompt_len + r.output_len > limit:
            raise RequestError(
                f"request {r.rid}: prompt_len={r.prompt_len} + output_len={r.output_len} "
                f"exceeds the runner's max_len={limit}"
            )
    # A given runner serves as it is: prefills overwrite its slabs, and ids are the requests'.
    if runner is None and checkpoint is None:
        runner = ModelRunner.from_shape(
            shape,
            scheduler.max_slots,
            device=dev,
            dtype=dt,
            seed=seed,
            max_len=max_len,
            graphs=graphs,
            kernels=plan,
        )
    elif runner is None and checkpoint is not None:
        check_model_fits(shape, scheduler.max_slots, dev, dt, max_len, graphs=graphs)  # before loading
        model = load_hf_checkpoint(checkpoint, dev, dt)
        if plan is not None:
            model.use_kernels(plan)
        runner = ModelRunner(model, scheduler.max_slots, max_len, seed, graphs=graphs)
    assert runner is not None
    ex = RealExecutor(
        runner,
        warmup_tokens=scheduler.max_step_prompt_tokens,
        graph_rows=scheduler.max_slots,
        graph_ctx=max(r.prompt_len + r.output_len for r in reqs) if reqs else None,
    )
    if not step_clock:
        return run(reqs, scheduler, ex, **run_kw)
    clock = StepClock(ex)
    return retime(run(reqs, scheduler, clock, **run_kw), clock.measured)
