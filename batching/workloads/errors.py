"""The error every workload, length distribution and trace loader raises (a ValueError: the
CLI prints it as one line, exit status 2)."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload, or a parameter used to build one, that cannot be served or sampled."""
