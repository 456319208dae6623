"""Advanced batching strategies: a small, legible serving-engine core for the book's chapter 7."""
import os as _os

# How long an idle OpenMP thread spins before it sleeps (libgomp reads this once, when torch
# loads it, so it is set here, before anything imports torch; a value set by the caller
# wins). Measured on the project's 2-core CPU (README, "Threads"): sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) makes every parallel region wake its threads, +30-50% on a
# decode step; libgomp's own default intermittently left one-query attention calls of
# 8 heads over <= 64 keys at 8 ms instead of 15 us; an explicit spin count gives neither.
_os.environ.setdefault("GOMP_SPINCOUNT", "100000")
