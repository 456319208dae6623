"""A real model to serve several runs in turn, and one real run on it: what every page's
live measurement and the benchmarks start from.

``runner = session("cpu-s", slots=2)`` builds the model with its slab KV cache on the device,
in the dtype and kernels the machine's probe chose; ``serve(runner, workload, "static",
slots=2)`` runs a workload on it under a scheduler named as the CLI names it;
:func:`compare_schedulers` runs several configurations on one model, each beside its
simulation on this machine's profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..costs.models import get_model
from ..costs.profile import ProfileCost, profile_measured_here
from ..engine import RunResult
from ..metrics import queue_growth, run_metrics
from ..results import load_average, machine_load
from ..schedulers import make_scheduler
from ..simulate import simulate
from ..workloads import Workload
from .executor import resolve_dtype, run_real
from .hardware import machine, resolve_device, set_threads
from .runner import ModelRunner

#: The model a real run builds by default on each kind of device: the CPU demo model whose
#: profile this book measured (cpu-s: prefills of thousands of tokens take about a second on
#: two cores), and the Llama 3.2 1B shape on a GPU (bf16).
DEFAULT_MODELS: dict[str, str] = {"cpu": "cpu-s", "cuda": "llama-1b"}


def device_kind(device: str = "auto") -> str:
    """``"cuda"`` or ``"cpu"``: the kind of device a real run on ``device`` uses ("auto": the
    GPU if there is one)."""
    return "cuda" if resolve_device(device).type == "cuda" else "cpu"


def default_model(model: str | None, device: str = "auto") -> str:
    """``model``, or :data:`DEFAULT_MODELS`' model for the device's kind when None."""
    return DEFAULT_MODELS[device_kind(device)] if model is None else model


def session(
    model: str | None = None,
    device: str = "auto",
    slots: int = 1,
    max_len: int | None = None,
    threads: int | None = None,
) -> ModelRunner:
    """One model (``None``: :func:`default_model`) with ``slots`` slabs of KV on ``device``,
    built once and served by several real runs in turn (:func:`serve`), in the dtype and
    kernels the machine's probe chose (bf16 on a GPU; on a CPU the faster here); ``threads``:
    torch's intra-op threads."""
    dev = resolve_device(device)
    shape = get_model(default_model(model, device))
    set_threads(threads)
    return ModelRunner.from_shape(
        shape, slots, device=dev, dtype=resolve_dtype("auto", dev, shape), max_len=max_len
    )


def serve(
    runner: ModelRunner, workload: Workload, scheduler: str, *, step_clock: bool = False, **options: Any
) -> RunResult:
    """One real run of ``workload`` on ``runner`` under ``scheduler`` (``options`` go to
    :func:`~batching.schedulers.make_scheduler`). ``step_clock``: the workload's arrivals
    count steps (:class:`~batching.real.executor.StepClock`)."""
    sched = make_scheduler(scheduler, max_context=runner.max_len, **options)
    return run_real(workload, sched, None, runner=runner, step_clock=step_clock)


def _with_stability(result: RunResult) -> dict[str, float]:
    """:func:`~batching.metrics.run_metrics` and ``stable`` (1.0 unless the run's queue grew
    over the replay: :func:`~batching.metrics.queue_growth`)."""
    return {**run_metrics(result), "stable": 1.0 - queue_growth(result)["growing"]}


def compare_schedulers(
    workload: Workload,
    configs: Mapping[str, Mapping[str, Any]],
    model: str | None = None,
    device: str = "auto",
    threads: int | None = None,
    profile: str | None = "auto",
) -> dict[str, Any]:
    """``workload`` on the real model under each ``{name: options}`` (``scheduler`` among
    them), one model for all runs: ``real`` ({name: :func:`~batching.metrics.run_metrics` and
    ``stable``}), ``executor``, ``model``, the machine's load and, with a ``profile`` measured
    for this model on this machine ("auto": :func:`~batching.costs.profile.profile_measured_here`),
    ``sim`` (the same runs simulated on it) and ``profile``. The slabs hold the model's whole
    context, the limit the simulator's schedulers see too: slabs cut to the longest request
    left a long prompt batched alone."""
    slots = max(int(o.get("slots", 32)) for o in configs.values())
    runner = session(model, device, slots=slots, threads=threads)
    out: dict[str, Any] = {"real": {}, "model": runner.cfg.name}
    if profile == "auto":
        profile = profile_measured_here(runner.cfg.name, machine(runner.device))
    cost = None
    if profile is not None:
        cost = ProfileCost.from_json(profile)
        if cost.model.name != runner.cfg.name:
            raise ValueError(f"profile {profile} is of {cost.model.name}, the runs use {runner.cfg.name}")
        out.update(sim={}, profile=profile)
    load0 = load_average()
    for name, opts in configs.items():
        opts = dict(opts)
        sched = opts.pop("scheduler")
        res = serve(runner, workload, sched, **opts)
        out["real"][name], out["executor"] = _with_stability(res), res.executor
        if cost is not None:
            # A KV budget is the scheduler's kv_capacity on the real engine, kv_tokens in the simulator.
            sim_opts = dict(opts)
            kv = sim_opts.pop("kv_capacity", None)
            out["sim"][name] = _with_stability(simulate(workload, cost, sched, kv_tokens=kv, **sim_opts))
    out.update(machine_load(load0, load_average()))
    return out
