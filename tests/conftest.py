"""Fixtures shared by the torch-model tests (test_model, test_real, test_graphs), and the figure
backend of every test that draws (set once, before any test module imports pyplot)."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def model64():
    """The ``tiny`` model in float64 (argmax near-ties cannot flip), seed 0; read-only in every test."""
    torch = pytest.importorskip("torch")
    from batching.costs.models import get_model
    from batching.real.model import Llama, ModelConfig

    return Llama(ModelConfig.from_shape(get_model("tiny")), "cpu", torch.float64, seed=0)
