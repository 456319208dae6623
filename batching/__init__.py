"""Advanced batching strategies: a small, legible serving-engine core for the book's chapter 7.

Importing it changes nothing outside the package: the thread and memory settings that the
real (torch) engine wants are set by :mod:`batching.real`, before torch loads."""
