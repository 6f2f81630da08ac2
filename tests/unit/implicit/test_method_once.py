"""The method against the paper's formulas written out here, in every mode the core runs it: eager
passes, and passes replayed from CUDA graphs (the CPU emulation, float64). Both modes share one
implementation of the solve, its stop rule and the damped update, so a break of any of them must
show in each mode on its own, not only as a gap between the two."""

from __future__ import annotations

import pytest
import torch
from support.cuda_graph_emulation import emulated

from implicit_megatron.implicit import SolverSettings

PHASES = {"(4+2)": SolverSettings(max_iter=4, phantom_steps=2, damping=0.8),
          "free": SolverSettings(max_iter=40, tol=1e-4, phantom_steps=2, damping=0.8)}


def by_hand(core, x: torch.Tensor, s: SolverSettings):
    """z^0 = 0, z <- F(z) until the batch's largest ||F(z) - z|| / ||F(z)|| is below tol (or max_iter
    passes), then `phantom_steps` times z <- (1 - lambda) z + lambda F(z) from the detached z*."""
    inj = core.injection(x)

    def f(z: torch.Tensor) -> torch.Tensor:
        return core.backbone(z, inj)

    z, passes = torch.zeros_like(x), 0
    with torch.no_grad():
        while passes < s.max_iter:
            f_z, passes = f(z), passes + 1
            residual = ((f_z - z).flatten(1).norm(dim=1) / f_z.flatten(1).norm(dim=1)).max()
            z = f_z
            if s.tol is not None and residual < s.tol:
                break
    z = z.detach()
    for _ in range(s.phantom_steps):
        z = (1 - s.damping) * z + s.damping * f(z)
    return z, passes


def gradients(core, out: torch.Tensor) -> dict[str, torch.Tensor]:
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), [p for p in core.parameters() if p.requires_grad])
    return dict(zip([n for n, p in core.named_parameters() if p.requires_grad], grads, strict=True))


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("mode", ["eager", "graphed"])
def test_a_training_forward_is_the_papers_solve_then_damped_phantom_steps(arch, make_model, mode, phase):
    model = make_model(arch, contractive=True).train()
    core, s = model.core, PHASES[phase]
    core.settings = s
    x = model.embedding(torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(0))).detach()
    expected, expected_passes = by_hand(core, x, s)
    expected_grads = gradients(core, expected)
    with emulated():
        core.cuda_graphs = "on" if mode == "graphed" else "off"
        for _ in range(3):  # the first forward of a shape runs eagerly, the second captures, the third replays
            out = core(x)
            grads = gradients(core, out)
        if mode == "graphed":
            assert {key[0] for key in core.graphs.cache} == {"solve", "grad"}
    assert core.last_stats.passes == expected_passes
    assert expected_passes == 4 if phase == "(4+2)" else 2 < expected_passes < s.max_iter  # the free phase stopped
    assert torch.allclose(out, expected, rtol=1e-10, atol=1e-12)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-9, atol=1e-12), name
