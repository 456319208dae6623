"""The figures of each page, one module per page (``figures.static`` draws 7.1's,
``figures.why`` the why page's and the measured page's decode sweep); the palette, figure
size and publishing helpers they share are in :mod:`batching.book.plots`."""

from . import chunked, continuous, kv, static, why

__all__ = ["chunked", "continuous", "kv", "static", "why"]
