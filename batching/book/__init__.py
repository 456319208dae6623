"""What the chapter's pages compute: one module per page (:mod:`.why`, :mod:`.static` 7.1,
:mod:`.continuous` 7.2, :mod:`.chunked` 7.3, :mod:`.kv`), each returning that page's numbers
and verdicts (numbers, small labels, booleans, tables as rows), plus the figures
(:mod:`.figures`, one module per page) and the helpers that glue numbers, tables and
figures into a page (:mod:`.plots`).

No function here returns a sentence of the book: the sentences live in the notebooks'
markdown, and where wording depends on a measurement the notebook picks it.

:mod:`.common` holds what every page shares (machine names, verdict enums, glue helpers),
:mod:`.checks` the real engine against the simulator and the simulator's measured error,
:mod:`.decode` and :mod:`.profiles` the live decode sweep and the committed profiles,
:mod:`.gpu` the GPU profiles derived from Vidur's measured tables (the H100's and A100's
linear layers against batch and chunk size), :mod:`.serve` 7.2's server replay, :mod:`.runs`
each live measurement once per build. No module here imports another page's module
(``tests/test_layout.py``): what two pages share is the library's (``simulate``,
``run_metrics``, ``capacity``, ``real.session``) or :mod:`.common`'s. Notebooks import the
modules they use (``from batching.book import figures, plots, static``).

Utilization means two different things here (README, "Semantics"; :mod:`batching.metrics`):
slot utilization (output tokens kept / (slots x steps)) and hardware utilization (achieved
FLOP/s or bytes/s over the device's peak, padding and dead rows included).
"""
