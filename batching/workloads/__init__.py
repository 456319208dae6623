"""The requests a run serves: a :class:`Workload` (synthetic draws, the chapter's presets, or
a real trace), its token-length distributions (``lengths``) and the trace loaders
(``traces``, finding the files through ``trace_files``). Builds on the core's
:class:`~batching.request.Request`; imports nothing else of the package.
"""

from __future__ import annotations

from .errors import WorkloadError
from .traces import TraceError, load_trace, trace_workload
from .workload import PRESETS, Workload, gamma_arrivals, poisson_arrivals, preset, synthetic

__all__ = [
    "PRESETS",
    "TraceError",
    "Workload",
    "WorkloadError",
    "gamma_arrivals",
    "load_trace",
    "poisson_arrivals",
    "preset",
    "synthetic",
    "trace_workload",
]
