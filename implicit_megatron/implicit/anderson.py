"""Anderson acceleration of the solver's passes (implicit.anderson), an alternative next iterate."""

from __future__ import annotations

import torch

from implicit_megatron.config import AndersonSettings


class AndersonHistory:
    """Anderson acceleration (type II) over the last `window` iterates, per sample.

    Solves min_a ||sum_i a_i g_i||^2 subject to sum_i a_i = 1, with g_i = F(x_i) - x_i and Tikhonov
    regularisation, then mixes x_next = sum_i a_i (F(x_i) - (1 - beta) g_i). The history stays in
    the iterate's dtype; only the small (window + 1)^2 system is solved in float64. A sample whose
    system is singular takes the plain iterate F(x) for that pass; the choice is made on the
    device, so a pass reads nothing back but the stop rule's residual.
    """

    def __init__(self, settings: AndersonSettings):
        self.settings = settings
        self.fs: list[torch.Tensor] = []  # F(x_i), flattened per sample
        self.gs: list[torch.Tensor] = []  # g_i

    def next_iterate(self, x: torch.Tensor, f_x: torch.Tensor) -> torch.Tensor:
        window = self.settings.window
        self.fs = [*self.fs, f_x.flatten(1)][-window:]
        self.gs = [*self.gs, (f_x - x).flatten(1)][-window:]
        m = len(self.fs)
        if m < 2:
            return f_x
        G = torch.stack(self.gs, dim=1)  # (B, m, n)
        gram = torch.einsum("bin,bjn->bij", G.float(), G.float()).double()
        batch = gram.shape[0]
        system = torch.zeros(batch, m + 1, m + 1, dtype=gram.dtype, device=gram.device)
        system[:, 0, 1:] = 1
        system[:, 1:, 0] = 1
        scale = gram.diagonal(dim1=1, dim2=2).mean(dim=1).clamp_min(1e-30)
        eye = torch.eye(m, dtype=gram.dtype, device=gram.device)
        system[:, 1:, 1:] = gram + self.settings.regularization * scale[:, None, None] * eye
        rhs = torch.zeros(batch, m + 1, 1, dtype=gram.dtype, device=gram.device)
        rhs[:, 0] = 1
        solution, info = torch.linalg.solve_ex(system, rhs)
        solved = (info == 0) & torch.isfinite(solution).flatten(1).all(1)  # per sample, on the device
        alpha = torch.where(solved[:, None, None], solution[:, 1:], 0.0).to(G.dtype)  # (B, m, 1)
        F = torch.stack(self.fs, dim=1)
        mixed = (alpha * (F - (1 - self.settings.mixing) * G)).sum(1)
        return torch.where(solved.view(-1, *[1] * (x.dim() - 1)), mixed.view_as(x), f_x)
