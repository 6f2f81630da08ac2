"""The tiny trained model every evaluation test uses (`tiny_run`, tests/conftest.py), loaded."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def loaded(tiny_run):
    """The export loaded for evaluation, with a tight tolerance: both modes converge closely."""
    from implicit_megatron.evaluation.loading import load_model
    from implicit_megatron.evaluation.phases import SolverChoice

    return load_model(tiny_run.export, choice=SolverChoice(tol=1e-4, max_iter=200))
