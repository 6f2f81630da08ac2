"""Theorem 1 (appendix A.2): the state-to-state Jacobian of an implicit SSM at its fixed point.

    dh_t/dh_{t-1} = Lambda + dLambda/dz dphi/dh diag(h_{t-1}) + du/dz dphi/dh,
    dphi/dh = (I - df/dz)^{-1} df/dh

On a one-layer implicit Mamba2 (d_model 64, head dim 8, d_state 4: 16 heads), the Jacobian by
autograd through the converged iteration must match the theorem's formula.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.autograd.functional import jacobian

PASSES = 60


def test_state_to_state_jacobian_matches_theorem_1(make_model):
    model = make_model("mamba2", "model.n_layers=1", "model.d_model=64", "model.mamba2.headdim=8",
                       "model.mamba2.d_state=4", contractive=True).eval()
    core = model.core
    backbone = core.backbone
    ids = torch.randint(0, 101, (1, 9))
    x = model.embedding(ids).detach()
    inj = core.injection(x).detach()
    core.settings = dataclasses.replace(core.settings, max_iter=200, tol=1e-13, eval_factor=1)
    _, state, _ = core.forward_sequential(x[:, :8])  # h_7*, committed
    (layer_state,) = state
    inj_t = inj[:, 8]

    def step(z, h):
        """One pass of F for token 8 under state h: (z', h')."""
        out, (candidate,) = backbone.step(z, (dataclasses.replace(layer_state, ssm=h),), inj_t)
        return out, candidate.ssm

    def iterate(h):
        z = torch.zeros(1, 64, dtype=h.dtype)
        for _ in range(PASSES):
            z, h_new = step(z, h)
        return h_new

    h_prev = layer_state.ssm.detach()
    n_state = h_prev.numel()
    j_autograd = jacobian(iterate, h_prev, vectorize=True).reshape(n_state, n_state)

    with torch.no_grad():
        z_star = torch.zeros(1, 64, dtype=h_prev.dtype)
        for _ in range(PASSES):
            z_next, _ = step(z_star, h_prev)
            residual = ((z_next - z_star).norm() / z_next.norm()).item()
            z_star = z_next
    assert residual < 1e-12
    df_dz = jacobian(lambda z: step(z, h_prev)[0], z_star).reshape(64, 64)
    df_dh = jacobian(lambda h: step(z_star, h)[0], h_prev).reshape(64, n_state)
    dh_dz = jacobian(lambda z: step(z, h_prev)[1], z_star).reshape(n_state, 64)  # dLambda/dz diag(h) + du/dz
    dh_dh = jacobian(lambda h: step(z_star, h)[1], h_prev).reshape(n_state, n_state)  # Lambda
    dphi_dh = torch.linalg.solve(torch.eye(64, dtype=df_dz.dtype) - df_dz, df_dh)
    j_theorem = dh_dh + dh_dz @ dphi_dh

    off_diagonal = ~torch.eye(n_state, dtype=torch.bool)
    assert (dh_dh[off_diagonal] == 0).all()  # Lambda alone, the explicit SSM's transition, is diagonal
    assert j_theorem[off_diagonal].abs().max() > 1e-6  # the implicit model's transition is not
    relative = (j_autograd - j_theorem).norm() / j_autograd.norm()
    assert relative < 1e-3, relative
    paper_metric = (j_autograd - j_theorem).abs() / (j_autograd.abs() + j_theorem.abs() + 1e-16)
    assert paper_metric.mean() < 1e-3
