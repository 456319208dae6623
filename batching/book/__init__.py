"""What the chapter's pages compute: one module per page, each returning that page's numbers
and verdicts (numbers, small labels, booleans, tables as rows), plus the figures
(:mod:`.figures`, one module per page) and the helpers that glue numbers, tables and
figures into a page (:mod:`.plots`).

No function here returns a sentence of the book: the sentences live in the notebooks'
markdown, and where wording depends on a measurement the notebook picks it.

Modules: :mod:`.common` (simulate, metrics, glue helpers), :mod:`.why` ("Why batching"),
:mod:`.decode` (the live decode sweep), :mod:`.profiles` (the committed profiles),
:mod:`.static` (7.1), :mod:`.continuous` (7.2), :mod:`.chunked` (7.3), :mod:`.capacity`
(capacity at a latency target, 7.2 and 7.3), :mod:`.kv` (what 7.2 sets up), :mod:`.checks`
(the real engine's runs and the simulator's measured error), :mod:`.runs` (each live
measurement once per build) and :mod:`.figures` with :mod:`.plots`. Notebooks import the modules they use
(``from batching.book import figures, plots, static``).

Utilization means two different things here (``shared/notes/conventions.md``): slot
utilization (output tokens kept / (slots x steps)) and hardware utilization (achieved FLOP/s
or bytes/s over the device's peak, padding and dead rows included).
"""
