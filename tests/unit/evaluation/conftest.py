"""The tiny trained model every evaluation test uses (trained once per session)."""

from __future__ import annotations

import pytest
from support.tiny_model import TinyRun, train_tiny


@pytest.fixture(scope="session")
def tiny_run(shakespeare_shards, tmp_path_factory) -> TinyRun:
    return train_tiny(tmp_path_factory.getbasetemp() / "tiny-eval-model", shakespeare_shards)


@pytest.fixture(scope="module")
def loaded(tiny_run):
    """The export loaded for evaluation, with a tight tolerance: both modes converge closely."""
    from implicit_megatron.evaluation.loading import load_model
    from implicit_megatron.evaluation.phases import SolverChoice

    return load_model(tiny_run.export, choice=SolverChoice(tol=1e-4, max_iter=200))
