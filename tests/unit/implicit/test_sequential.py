"""Sequential mode (token by token, committed state) against simultaneous mode (whole sequence)."""

from __future__ import annotations

import pytest
import torch

from implicit_megatron.implicit import SolverSettings


@pytest.mark.parametrize("rule", ["released", "solver"])
def test_both_modes_reach_the_same_fixed_points(arch, rule, make_model):
    model = make_model(arch, contractive=True).eval()
    tol = 1e-9
    model.core.settings = SolverSettings(max_iter=300, tol=tol, phantom_steps=1, damping=0.8, eval_factor=1,
                                         eval_rule=rule)
    ids = torch.randint(0, 101, (2, 20))
    x = model.embedding(ids)
    with torch.no_grad():
        z_simultaneous = model.core(x)
    assert model.core.last_stats.passes < 300 and (model.core.last_stats.residual < 10 * tol).all()
    z_sequential, _, stats = model.core.forward_sequential(x)
    assert all(s.passes < 300 and (s.residual < 10 * tol).all() for s in stats)
    assert (z_simultaneous - z_sequential).abs().max().item() < 100 * tol
    same = model.logits(z_simultaneous).argmax(-1) == model.logits(z_sequential).argmax(-1)
    assert same.all()


def test_sequential_mode_continues_from_a_committed_state(arch, make_model):
    model = make_model(arch, contractive=True).eval()
    model.core.settings = SolverSettings(max_iter=300, tol=1e-10, phantom_steps=1, eval_factor=1)
    x = model.embedding(torch.randint(0, 101, (1, 12)))
    whole, _, _ = model.core.forward_sequential(x)
    state = model.core.backbone.allocate_state(1, 12, device=x.device, dtype=x.dtype)
    first, state, _ = model.core.forward_sequential(x[:, :5], state)
    second, _, _ = model.core.forward_sequential(x[:, 5:], state)
    assert torch.allclose(torch.cat([first, second], dim=1), whole, atol=1e-12)


def test_memory_does_not_grow_with_passes(arch, make_model):
    """Sequential mode runs without autograd: nothing is kept from one pass to the next."""
    model = make_model(arch).eval()
    x = model.embedding(torch.randint(0, 101, (1, 6))).detach()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        for passes in (2, 16):
            model.core.settings = SolverSettings(max_iter=passes, eval_factor=1, eval_tol=None)
            z, state, stats = model.core.forward_sequential(x)
            assert stats[0].passes == passes and not z.requires_grad
    assert saved == []
