"""Advanced batching strategies: a small, legible serving-engine core for the book's chapter 7."""

import os as _os

# How long an idle OpenMP thread spins before it sleeps (libgomp reads this once, when torch
# loads it, so it is set here, before anything imports torch; a value set by the caller
# wins). Measured on the project's 2-core CPU (README, "Threads"): sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) makes every parallel region wake its threads, +30-50% on a
# decode step; libgomp's own default intermittently left one-query attention calls of
# 8 heads over <= 64 keys at 8 ms instead of 15 us; an explicit spin count gives neither.
_os.environ.setdefault("GOMP_SPINCOUNT", "100000")

# Large CPU tensors (the weights, the KV slabs) on 2 MB transparent huge pages: PyTorch's
# CPU allocator asks for them (madvise) when this is set before its first allocation.
# Where the kernel's THP mode is "madvise" (this project's machines), a decode step, which
# streams every weight once, was ~10% faster with it (cpu-m batch 1, four alternating
# process pairs: 28.0/24.6/27.8/29.6 ms against 31.7/28.9/29.1/40.6 ms): 512x fewer TLB
# misses while streaming. It costs nothing where THP is "always" or "never".
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
