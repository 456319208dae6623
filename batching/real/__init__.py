"""The real engine: everything in the package that imports torch.

:mod:`.hardware` (which device, its registry entry, its free memory), :mod:`.model` (the
Llama-style model and its attention kernels), :mod:`.cache` (the slab KV cache),
:mod:`.graphs` (CUDA-graph decode over the model and the cache), :mod:`.runner` (the step
runner), :mod:`.executor` (runs a scheduler's plans on the model), :mod:`.measure`
(step-cost profiles for the simulator) and :mod:`.checkpoint` (Hugging Face safetensors
checkpoints). The torch-free library (:mod:`batching`) never imports this package at import
time; the CLI loads it only for ``run``, ``measure`` and ``kernels``.

Importing this package (which itself imports no torch) sets :data:`ENV_DEFAULTS` in
``os.environ`` where the caller has not set them: torch reads them when it loads, and every
module here is imported through this file first. A script that imports torch itself imports
``batching.real`` before it (``benchmarks/``), and the servers started on this machine get
the same defaults (:mod:`batching.servers`).
"""

import os as _os

#: Environment variables the real engine sets before torch loads (a value set by the caller
#: wins). Measured on the project's 2-core CPU (README, "Threads").
ENV_DEFAULTS: dict[str, str] = {
    # How long an idle OpenMP thread spins before it sleeps (libgomp reads this once, when
    # torch loads it). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) makes every parallel region
    # wake its threads, +30-50% on a decode step; libgomp's own default intermittently left
    # one-query attention calls of 8 heads over <= 64 keys at 8 ms instead of 15 us; an
    # explicit spin count gives neither.
    "GOMP_SPINCOUNT": "100000",
    # Large CPU tensors (the weights, the KV slabs) on 2 MB transparent huge pages: PyTorch's
    # CPU allocator asks for them (madvise) when this is set before its first allocation.
    # Where the kernel's THP mode is "madvise" (this project's machines), a decode step, which
    # streams every weight once, was ~10% faster with it (cpu-m batch 1, four alternating
    # process pairs: 28.0/24.6/27.8/29.6 ms against 31.7/28.9/29.1/40.6 ms): 512x fewer TLB
    # misses while streaming. It costs nothing where THP is "always" or "never".
    "THP_MEM_ALLOC_ENABLE": "1",
}

for _name, _value in ENV_DEFAULTS.items():
    _os.environ.setdefault(_name, _value)
