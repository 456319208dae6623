"""What the chapter's pages compute: one module per page (:mod:`.why`, :mod:`.static` 7.1,
:mod:`.continuous` 7.2, :mod:`.chunked` 7.3, :mod:`.kv`), each returning that page's numbers
and verdicts (numbers, small labels, booleans, tables as rows), plus the figures
(:mod:`.figures`, one module per page) and the helpers that glue numbers, tables and
figures into a page (:mod:`.plots`).

No function here returns a sentence of the book: the sentences live in the notebooks'
markdown, and where wording depends on a measurement the notebook picks it.

:mod:`.common` holds what every page shares (simulate, metrics, verdicts, glue helpers),
:mod:`.capacity` capacity at a latency target (7.2, 7.3), :mod:`.checks` the real engine's
runs and the simulator's measured error, :mod:`.decode` and :mod:`.profiles` the live decode
sweep and the committed profiles, :mod:`.gpu` the GPU profiles derived from Vidur's
measured tables (the H100's and A100's linear layers against batch and chunk size),
:mod:`.chunked_real` 7.3's real runs, :mod:`.serve` 7.2's
server replay, :mod:`.runs` each live measurement once per build. Notebooks import the
modules they use (``from batching.book import figures, plots, static``).

Utilization means two different things here (``shared/notes/conventions.md``): slot
utilization (output tokens kept / (slots x steps)) and hardware utilization (achieved FLOP/s
or bytes/s over the device's peak, padding and dead rows included).
"""

import warnings

# huggingface_hub imports tqdm.auto, which warns in a Jupyter kernel without ipywidgets
# ("IProgress not found"); the pages are static HTML, where a widget could not render
# anyway, and the warning would be printed on the page.
warnings.filterwarnings("ignore", message="IProgress not found")
