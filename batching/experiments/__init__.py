"""The experiments behind chapter 7's notebooks, one module per section: small functions
that run a comparison or a sweep through the simulator (or, for the measured sections, the
real engine: 7.1's padding, 7.2's cross-check, 7.3's stall, the live decode curve) and
return tidy dicts of plain Python numbers and numpy arrays.

Notebooks call these and plot the results with :mod:`batching.plots`; nothing else in a
notebook computes. Each function names the section it serves. All simulations use the
roofline cost model (``batching.costs``): their numbers are predictions for the named
model, dtype and device, not measurements.

Utilization means two different things here (``shared/notes/conventions.md``):

* **slot utilization**: output tokens kept / (slots x steps), the fraction of the batch's
  token slots that produced a token the user keeps (``metrics.summarize``);
* **hardware utilization**: achieved FLOP/s / peak (compute) and bytes/s / bandwidth
  (memory), counting every FLOP and byte the steps perform, padding and dead rows included.
  :func:`useful_flops` adds a third view used in 7.2: only the FLOPs an ideal engine must
  do for the workload (each prompt prefilled once, each output token decoded once).

Modules: :mod:`~batching.experiments.common` (simulate, metrics, glue helpers),
:mod:`~batching.experiments.why` ("Why batching"), :mod:`~batching.experiments.static` (7.1),
:mod:`~batching.experiments.continuous` (7.2), :mod:`~batching.experiments.chunked` (7.3),
:mod:`~batching.experiments.kv` (what 7.2 sets up) and :mod:`~batching.experiments.checks`
(the real engine's cross-check and the simulator's measured error). Notebooks import the
package (``from batching import experiments as E``) and find every function on it.
"""
from __future__ import annotations

from .common import (KINDS, describe_cost, roofline_numbers, offered_rate, fit_context, capped_text,
                     trace_workload, simulate, useful_flops, metrics, choose, at, flat)
from .why import (LIVE_DEFAULTS, PROFILE_DIR, bstar_of, knee, roofline_curve, stream_numbers,
                  gpu_rooflines, live_defaults, decode_paths, live_decode_sweep, live_roofline,
                  profile_roofline, live_numbers, live_text, live_labels, knee_text, batch1_kernel_text, load_profiles,
                  profiles_text, profile_rows, slab_cost_text, slab_cost_takeaway, gather_bytes,
                  gather_answer_text, profile_stream, find_profile, stream_entries,
                  size_efficiency_text, stream_share_text, bandwidth_note, bstar_answer_text)
from .static import (padding_cost, REAL_PADDING_LONG, real_padding, real_padding_rows,
                     committed_padding_text, Segment, timeline, slot_steps, analytic_static_utilization,
                     static_batch_sweep, wait_sweep, first_finisher_summary, static_batch_sizes,
                     sweep_agreement_text, wait_summary, wait_point, wait_takeaway, real_padding_text)
from .continuous import (compare_schedulers, rate_sweep, sweep_numbers, saturation, with_probes,
                         probe_runs, iterations, subset_latency, decode_compute_share,
                         decode_step_ms, first_finisher_queue, probe_summary, dense_batches, batch_fill,
                         metric_range, hw_compute_text, slab_text, bend_text)
from .chunked import (long_prompt_among_decodes, itl_series, spike_summary, stall_summary, stall_runs,
                      REAL_STALL, STALL_ATTEMPTS, stall_overlaps, stall_configs, real_stall,
                      committed_stall_text, stall_numbers,
                      tradeoff_numbers, chunk_step_times, profile_chunk_steps, profile_chunk_text,
                      chunk_sweep, nochunk_text, real_chunk_text, chunk_for_itl,
                      calibration_text, slow_steps_text, ttft_cost_text, trace_contrast)
from .kv import (kv_over_time, kv_runs, kv_fit, kv_budget_sweep, budget_numbers, slab_growth,
                 REAL_KV_ROWS, real_kv_configs, real_kv, real_kv_text)
from .checks import (REAL_MODELS, real_kind, real_model, real_runner, serve_real, executor_text, STALL_GLOB,
                     committed_real_runs, real_runs_label, committed_text, predicted_steps,
                     profile_measured_here, real_schedulers, real_schedulers_rows, real_schedulers_text,
                     real_available, real_crosscheck, crosscheck_text, crosscheck_rows,
                     FIDELITY_FILE, FIDELITY_GLOB, fidelity_summary, gpu_fidelity_files)

__all__ = [
    "KINDS", "describe_cost", "roofline_numbers", "offered_rate", "fit_context", "capped_text", "trace_workload",
    "simulate", "useful_flops", "metrics", "choose", "at", "flat", "LIVE_DEFAULTS", "PROFILE_DIR",
    "bstar_of", "knee", "roofline_curve", "stream_numbers", "gpu_rooflines", "live_defaults",
    "decode_paths", "live_decode_sweep", "live_roofline", "profile_roofline", "live_numbers",
    "live_text", "live_labels", "knee_text", "batch1_kernel_text", "load_profiles", "profiles_text", "profile_rows",
    "slab_cost_text", "slab_cost_takeaway", "gather_bytes", "gather_answer_text", "profile_stream", "find_profile",
    "stream_entries", "size_efficiency_text", "stream_share_text", "bandwidth_note", "bstar_answer_text",
    "padding_cost", "REAL_PADDING_LONG", "real_padding", "real_padding_rows", "committed_padding_text",
    "Segment", "timeline", "slot_steps", "analytic_static_utilization", "static_batch_sweep",
    "wait_sweep", "first_finisher_summary", "static_batch_sizes", "sweep_agreement_text", "wait_summary",
    "wait_point", "wait_takeaway", "real_padding_text", "compare_schedulers", "rate_sweep", "sweep_numbers",
    "saturation", "with_probes", "probe_runs", "iterations", "subset_latency", "decode_compute_share",
    "decode_step_ms", "first_finisher_queue", "probe_summary", "dense_batches", "batch_fill", "metric_range",
    "hw_compute_text", "slab_text", "bend_text",
    "long_prompt_among_decodes",
    "itl_series", "spike_summary", "stall_summary", "stall_runs", "REAL_STALL", "stall_configs",
    "real_stall", "STALL_ATTEMPTS", "stall_overlaps", "committed_stall_text", "stall_numbers",
    "tradeoff_numbers", "chunk_step_times",
    "profile_chunk_steps", "profile_chunk_text", "chunk_sweep", "nochunk_text", "real_chunk_text",
    "chunk_for_itl", "calibration_text", "slow_steps_text", "ttft_cost_text", "trace_contrast", "kv_over_time", "kv_runs", "kv_fit",
    "kv_budget_sweep", "budget_numbers", "slab_growth", "REAL_KV_ROWS", "real_kv_configs", "real_kv",
    "real_kv_text", "REAL_MODELS", "real_kind", "real_model", "real_runner", "serve_real",
    "executor_text", "STALL_GLOB", "committed_real_runs", "real_runs_label", "committed_text",
    "predicted_steps", "profile_measured_here", "real_schedulers", "real_schedulers_rows",
    "real_schedulers_text", "real_available", "real_crosscheck", "crosscheck_text", "crosscheck_rows",
    "FIDELITY_FILE", "FIDELITY_GLOB", "fidelity_summary", "gpu_fidelity_files",
]
