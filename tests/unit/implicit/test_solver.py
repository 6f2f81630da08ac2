"""The fixed-point solver on functions whose fixed points are known in closed form."""

from __future__ import annotations

import torch

from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit.iteration import relative_residual
from implicit_megatron.implicit.solver import solve


def affine_contraction(batch: int = 3, n: int = 20, rate: float = 0.7, seed: int = 0):
    """F(z) = A z + b, A symmetric with spectrum in [0, rate]; the fixed point solves (I - A) z = b."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    spectrum = torch.linspace(0, rate, n, dtype=torch.float64)
    A = q @ torch.diag(spectrum) @ q.T
    b = torch.randn(batch, n, generator=g, dtype=torch.float64)
    z_star = torch.linalg.solve(torch.eye(n, dtype=torch.float64) - A, b.T).T
    return (lambda z: z @ A.T + b), z_star


def test_relative_residual_is_per_sample_over_all_other_dims():
    f_z = torch.ones(2, 3, 4)
    z = torch.zeros(2, 3, 4)
    z[1] = 0.5
    assert torch.allclose(relative_residual(f_z, z), torch.tensor([1.0, 0.5]))


def test_bounded_phase_runs_exactly_max_iter_passes():
    calls = []
    f, _ = affine_contraction()

    def counted(z):
        calls.append(1)
        return f(z)

    _, stats = solve(counted, torch.zeros(3, 20, dtype=torch.float64), max_iter=7, tol=None)
    assert stats.passes == 7 and len(calls) == 7 and stats.converged.all()


def test_stops_at_tolerance_and_reaches_the_fixed_point():
    f, z_star = affine_contraction(rate=0.5)
    z, stats = solve(f, torch.zeros(3, 20, dtype=torch.float64), max_iter=200, tol=1e-10)
    assert stats.passes < 200 and stats.converged.all() and (stats.residual < 1e-10).all()
    assert torch.allclose(z, z_star, atol=1e-9)
    # the stop rule: the pass before the last was not yet converged
    _, earlier = solve(f, torch.zeros(3, 20, dtype=torch.float64), max_iter=stats.passes - 1, tol=1e-10)
    assert earlier.residual.max() >= 1e-10 and not earlier.converged.all()


def test_cap_reports_unconverged_samples():
    f, _ = affine_contraction(rate=0.95)
    _, stats = solve(f, torch.zeros(3, 20, dtype=torch.float64), max_iter=3, tol=1e-6)
    assert stats.passes == 3 and not stats.converged.any()


def test_anderson_reaches_tolerance_in_fewer_passes():
    f, z_star = affine_contraction(rate=0.95, seed=1)
    z0 = torch.zeros(3, 20, dtype=torch.float64)
    _, plain = solve(f, z0, max_iter=1000, tol=1e-8)
    z, accel = solve(f, z0, max_iter=1000, tol=1e-8, anderson=AndersonSettings(enabled=True, window=6))
    assert accel.converged.all() and accel.passes < plain.passes / 2
    assert torch.allclose(z, z_star, atol=1e-6)


def test_anderson_falls_back_on_a_singular_system():
    z0 = torch.zeros(2, 5, dtype=torch.float64)
    f = lambda z: torch.ones_like(z)  # noqa: E731  residual history is identical: a singular Gram matrix
    z, stats = solve(f, z0, max_iter=5, tol=None, anderson=AndersonSettings(enabled=True, regularization=0.0))
    assert torch.isfinite(z).all() and torch.equal(z, torch.ones_like(z)) and stats.passes == 5


def test_anderson_reads_the_host_only_for_the_stop_rule():
    """One read per pass, the agreed residual; the singular-system fallback is decided on the device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Items(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Items.count += 1
            return func(*args, **(kwargs or {}))

    f, _ = affine_contraction(rate=0.95, seed=1)
    with Items():
        _, stats = solve(f, torch.zeros(3, 20, dtype=torch.float64), max_iter=50, tol=1e-8,
                         anderson=AndersonSettings(enabled=True, window=6))
    assert Items.count == stats.passes


def test_zero_passes_returns_the_start():
    z0 = torch.randn(2, 4)
    z, stats = solve(lambda z: z + 1, z0, max_iter=0, tol=None)
    assert z is z0 and stats.passes == 0


def test_a_capped_solve_returns_each_samples_lowest_residual_iterate():
    """F alternates between a near and a far point for sample 0 (its residual oscillates) and
    converges for sample 1: sample 0 gets the iterate of its lowest residual, not the last."""
    targets = [torch.tensor(t, dtype=torch.float64) for t in ([1.0, 0.0], [0.0, 1.0], [1.0, 0.2])]

    class Oscillating:
        calls = 0

        def __call__(self, z):
            out = 0.5 * z + 0.5
            out[0] = targets[self.calls % 3]
            self.calls += 1
            return out

    z0 = torch.zeros(2, 2, dtype=torch.float64)
    f = Oscillating()
    z, stats = solve(f, z0, max_iter=6, tol=1e-3)
    assert stats.passes == 6 and not stats.converged[0]
    # residuals of sample 0: pass 1 ||t0 - 0||/||t0|| = 1, pass 2 ||t1 - t0||/||t1|| = 1.414,
    # pass 3 ||t2 - t1||/||t2|| = 1.256, pass 4 ||t0 - t2||/||t0|| = 0.2 (the lowest), pass 5 1.414, 6 1.256
    assert torch.equal(z[0], targets[0]) and abs(stats.residual[0].item() - 0.2) < 1e-12
    last = 0.5 * (0.5 * (0.5 * (0.5 * (0.5 * (0.5 * 0 + 0.5) + 0.5) + 0.5) + 0.5) + 0.5) + 0.5
    assert torch.allclose(z[1], torch.full((2,), last, dtype=torch.float64))  # monotone: the last iterate
    _, bounded = solve(Oscillating(), z0, max_iter=6, tol=None)  # a fixed-depth solve keeps the last
    assert abs(bounded.residual[0].item() - (1.64 / 1.04) ** 0.5) < 1e-12
