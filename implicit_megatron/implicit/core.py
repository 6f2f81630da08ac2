"""ImplicitCore: the backbone self-iterated to a fixed point, in two modes.

Simultaneous mode (training, evaluation): every pass runs the whole sequence through F; the solver
finds z* without gradient, then `phantom_steps` damped passes carry the gradient: the paper's (s+k).
Sequential mode (generation): token by token, iterate z_t under the committed per-layer state of
t-1 until converged, then commit the state once. Memory is constant in the number of passes.

The explicit baseline goes through the same module: one pass from z^0 = embedding, no injection.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from implicit_megatron.config import AndersonSettings, ImplicitConfig
from implicit_megatron.implicit.injection import Injection
from implicit_megatron.implicit.phantom import phantom_steps
from implicit_megatron.implicit.solver import SolverStats, relative_residual, solve


@dataclass
class SolverSettings:
    """The knobs of one (s+k) phase; a curriculum swaps them between phases."""

    max_iter: int = 4
    tol: float | None = None
    phantom_steps: int = 1
    damping: float = 0.8
    eval_factor: int = 4
    gradient: str = "phantom"  # or "unrolled"
    anderson: AndersonSettings = field(default_factory=AndersonSettings)

    @classmethod
    def from_config(cls, cfg: ImplicitConfig) -> SolverSettings:
        return cls(cfg.max_iter, cfg.tol, cfg.phantom_steps, cfg.damping, cfg.eval_factor, cfg.gradient,
                   cfg.anderson)

    def cap(self, training: bool) -> int:
        """Passes allowed: a free phase evaluates with eval_factor x max_iter; a bounded phase
        (tol None) is a fixed-depth weight-tied network and evaluates exactly as it trains."""
        return self.max_iter if training or self.tol is None else self.max_iter * self.eval_factor


class ImplicitCore(nn.Module):
    """x (B, T, d) = embedding -> z (B, T, d), the (normalised) fixed point of the backbone."""

    def __init__(self, backbone: nn.Module, settings: SolverSettings | None, injection: Injection | None,
                 group=None):
        super().__init__()
        self.backbone = backbone
        self.injection = injection
        self.settings = settings  # None: the explicit model (one pass, no injection)
        self.group = group  # data-parallel process group the stop rule is agreed over (None: world)
        self.last_stats: SolverStats | None = None

    @property
    def implicit(self) -> bool:
        return self.settings is not None

    def set_phase(self, **changes) -> None:
        """Switch solver settings, e.g. set_phase(max_iter=24, tol=0.05, phantom_steps=4)."""
        self.settings = replace(self.settings, **changes)

    # ------------------------------------------------------------------ simultaneous mode

    def forward(self, x: torch.Tensor, seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        if not self.implicit:
            return self.backbone(x, None, seq_idx=seq_idx)
        inj = self.injection(x) if self.injection is not None else None

        def f(z: torch.Tensor) -> torch.Tensor:
            return self.backbone(z, inj, seq_idx=seq_idx)

        s = self.settings
        z0 = torch.zeros_like(x)
        if s.gradient == "unrolled" and torch.is_grad_enabled():
            return self._unrolled(f, z0)
        z_star, stats = solve(f, z0, s.cap(self.training), s.tol, s.anderson, self.group)
        z = phantom_steps(f, z_star, s.phantom_steps, s.damping)
        stats.phantom_passes = s.phantom_steps
        self.last_stats = stats
        return z

    def _unrolled(self, f, z: torch.Tensor) -> torch.Tensor:
        """The weight-tied ablation: backpropagation through every one of max_iter passes."""
        s = self.settings
        for _ in range(s.max_iter):
            f_z = f(z)
            residual = relative_residual(f_z.detach(), z.detach())
            z = f_z
        converged = residual < s.tol if s.tol is not None else torch.ones_like(residual, dtype=torch.bool)
        self.last_stats = SolverStats(0, residual, converged, phantom_passes=s.max_iter)
        return z

    # ------------------------------------------------------------------ sequential mode

    @torch.no_grad()
    def forward_sequential(self, x: torch.Tensor, state=None, max_len: int | None = None
                           ) -> tuple[torch.Tensor, object, list[SolverStats]]:
        """Process x (B, T, d) one token at a time; returns z (B, T, d), the committed state and
        per-token statistics. `state` continues a previous call (generation); None starts a fresh
        one with room for `max_len` tokens (default T; Llama's KV cache needs it, Mamba2's state is
        constant in size). Packed documents are not separated here: pass one document per row."""
        batch, length, _ = x.shape
        if state is None:
            state = self.backbone.allocate_state(batch, max_len or length, device=x.device, dtype=x.dtype)
        inj = self.injection(x) if self.implicit and self.injection is not None else None
        outputs, stats = [], []
        for t in range(length):
            inj_t = inj[:, t] if inj is not None else None
            z_t, state, token_stats = self.step(x[:, t], inj_t, state)
            outputs.append(z_t)
            stats.append(token_stats)
        return torch.stack(outputs, dim=1), state, stats

    @torch.no_grad()
    def step(self, x_t: torch.Tensor, inj_t: torch.Tensor | None, state) -> tuple[torch.Tensor, object, SolverStats]:
        """One token: iterate under the committed `state`, then return (z_t, new committed state)."""
        if not self.implicit:
            z_t, state = self.backbone.step(x_t, state, None)
            return z_t, state, SolverStats(1, torch.zeros(x_t.shape[0]), torch.ones(x_t.shape[0], dtype=torch.bool))
        s = self.settings
        cap = s.cap(self.training)
        z, passes = torch.zeros_like(x_t), 0
        residual = torch.zeros(x_t.shape[0], device=x_t.device)
        candidate = state
        while passes < cap:
            passes += 1
            f_z, candidate = self.backbone.step(z, state, inj_t)
            residual = relative_residual(f_z, z)
            z = f_z
            if s.tol is not None and residual.max().item() < s.tol:
                break
        for _ in range(s.phantom_steps):  # the same damped steps that end the simultaneous mode
            f_z, candidate = self.backbone.step(z, state, inj_t)
            z = (1.0 - s.damping) * z + s.damping * f_z
        converged = residual < s.tol if s.tol is not None else torch.ones_like(residual, dtype=torch.bool)
        return z, candidate, SolverStats(passes, residual, converged, phantom_passes=s.phantom_steps)
