"""Options of the implicit core: weight normalisation, the evaluation cap, the explicit path."""

from __future__ import annotations

import pytest
import torch

from implicit_megatron.builder import remove_weight_norm, weight_normed_layers
from implicit_megatron.implicit import SolverSettings


def test_weight_norm_keeps_the_function_and_folds_back_for_export(arch, make_model):
    plain = make_model(arch, "implicit.weight_norm=false", seed=3).eval()
    normed = make_model(arch, "implicit.weight_norm=true", seed=3).eval()
    layers = weight_normed_layers(normed.core.backbone)
    assert layers and all(hasattr(layer, "parametrizations") for layer in layers)
    names = [n for n, _ in normed.named_parameters()]
    assert any(n.endswith("parametrizations.weight.original0") for n in names)  # g
    assert any(n.endswith("parametrizations.weight.original1") for n in names)  # v
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        # at initialisation g = ||v|| (computed in float32 before the model became float64)
        assert (normed(ids) - plain(ids)).abs().max() < 1e-6
        before = normed(ids)
        remove_weight_norm(normed)
        assert set(normed.state_dict()) == set(plain.state_dict())
        assert (normed(ids) - before).abs().max() < 1e-12


def test_evaluation_cap(make_model):
    settings = SolverSettings(max_iter=6, tol=1e-30, eval_factor=4)
    assert settings.cap(training=True) == 6 and settings.cap(training=False) == 24
    bounded = SolverSettings(max_iter=4, tol=None, eval_factor=4, eval_tol=None)
    assert bounded.cap(training=False) == 4  # a bounded phase evaluated at its depth is a fixed-depth network
    model = make_model("llama")
    model.core.settings = settings
    ids = torch.randint(0, 101, (1, 8))
    with torch.no_grad():
        model.train()(ids)
        assert model.core.last_stats.passes == 6
        model.eval()(ids)
        assert model.core.last_stats.passes == 24


def test_explicit_core_is_one_pass_without_injection(arch, make_model):
    model = make_model(arch).eval()
    model.core.settings = None
    ids = torch.randint(0, 101, (2, 10))
    with torch.no_grad():
        x = model.embedding(ids)
        assert torch.equal(model(ids), model.logits(model.core.backbone(x)))


@pytest.mark.parametrize("rule", ["released", "solver"])
def test_a_bounded_phase_evaluates_to_its_evaluation_tolerance(arch, rule, make_model):
    """(4+1) trains exactly 4 passes; in evaluation it runs past 4 and stops at eval_tol, as the
    released (4+1) models are evaluated; eval_tol None is the fixed-depth view."""
    model = make_model(arch, contractive=True)
    model.core.settings = SolverSettings(max_iter=4, tol=None, phantom_steps=1, eval_factor=10, eval_tol=1e-4,
                                         eval_rule=rule)
    ids = torch.randint(0, 101, (2, 10))
    with torch.no_grad():
        model.train()(ids)
        trained = model.core.last_stats
        assert trained.passes == 4 and trained.converged_frac == 0.0  # converged means below eval_tol
        model.eval()(ids)
        evaluated = model.core.last_stats
        assert 4 < evaluated.passes < 40 and (evaluated.residual < 2e-4).all()
        assert rule == "released" or evaluated.converged.all()  # released: one stop test for the batch
        model.core.set_phase(eval_tol=None)
        model(ids)
        assert model.core.last_stats.passes == 4
