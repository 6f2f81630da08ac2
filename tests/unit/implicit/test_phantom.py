"""Phantom gradients: exactness against unrolled backprop, convergence to the IFT gradient, memory."""

from __future__ import annotations

import torch

from implicit_megatron.implicit import SolverSettings


def gradients(model, input_ids: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten()).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_k_equals_s_with_unit_damping_is_unrolled_backprop(arch, make_model):
    model = make_model(arch).train()
    ids = torch.randint(0, 101, (2, 24))
    s = 3
    model.core.settings = SolverSettings(max_iter=0, phantom_steps=s, damping=1.0)
    phantom = gradients(model, ids)
    model.core.settings = SolverSettings(max_iter=s, gradient="unrolled")
    unrolled = gradients(model, ids)
    assert phantom.shape == unrolled.shape and unrolled.abs().max() > 0
    assert ((phantom - unrolled).norm() / unrolled.norm()).item() < 1e-10


def ift_gradient(core, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """d<w, z*>/d theta by the implicit function theorem, with the adjoint solved by iteration."""
    params = [p for p in core.parameters() if p.requires_grad]
    inj = core.injection(x)
    with torch.no_grad():
        z = torch.zeros_like(x)
        for _ in range(500):
            z, z_last = core.backbone(z, inj), z
            if (z - z_last).norm() < 1e-14 * z.norm():
                break
    z = z.detach().requires_grad_(True)
    f_z = core.backbone(z, inj)
    u = w.clone()
    for _ in range(500):  # u = w + J^T u
        (vjp,) = torch.autograd.grad(f_z, z, u, retain_graph=True)
        u_next = w + vjp
        if (u_next - u).norm() < 1e-14 * u_next.norm():
            break
        u = u_next
    grads = torch.autograd.grad(f_z, params, u, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def phantom_gradient(core, x: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    core.settings = SolverSettings(max_iter=500, tol=1e-13, phantom_steps=k, damping=0.8)
    params = [p for p in core.parameters() if p.requires_grad]
    grads = torch.autograd.grad((core(x) * w).sum(), params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def test_phantom_gradient_approaches_the_implicit_function_theorem(arch, make_model):
    model = make_model(arch, contractive=True).train()
    core = model.core
    torch.manual_seed(1)
    x = model.embedding(torch.randint(0, 101, (2, 16))).detach()
    w = torch.randn_like(x)
    exact = ift_gradient(core, x, w)
    cosines = []
    for k in (1, 2, 4, 8, 16, 48):
        g = phantom_gradient(core, x, w, k)
        cosines.append(torch.nn.functional.cosine_similarity(g, exact, dim=0).item())
    assert core.last_stats.converged.all()
    assert all(b >= a - 1e-4 for a, b in zip(cosines, cosines[1:])), cosines
    assert cosines[0] < cosines[-1] and cosines[-1] > 0.999, cosines


def saved_bytes(model, ids: torch.Tensor) -> int:
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids).sum().backward()
    return total


def test_memory_is_flat_in_solver_passes_and_grows_with_phantom_steps(arch, make_model):
    model = make_model(arch).train()
    ids = torch.randint(0, 101, (2, 32))
    by_setting = {}
    for s, k in ((4, 4), (24, 4), (4, 1), (4, 2)):
        model.core.settings = SolverSettings(max_iter=s, phantom_steps=k)
        by_setting[(s, k)] = saved_bytes(model, ids)
        assert model.core.last_stats.passes == s
    assert by_setting[(4, 4)] == by_setting[(24, 4)]
    assert by_setting[(4, 1)] < by_setting[(4, 2)] < by_setting[(4, 4)]


def test_phantom_steps_under_activation_checkpointing(arch, make_model):
    model = make_model(arch).train()
    ids = torch.randint(0, 101, (2, 16))
    model.core.settings = SolverSettings(max_iter=3, phantom_steps=2)
    plain = gradients(model, ids)
    model.core.backbone.checkpoint_layers = True
    checkpointed = gradients(model, ids)
    assert ((plain - checkpointed).norm() / plain.norm()).item() < 1e-12


def test_unrolled_damped_is_the_released_warm_up(arch, make_model):
    """z = F(0), then three times z <- 0.2 z + 0.8 F(z), backpropagated through every pass: the same
    logits and gradients as those passes written out by hand."""
    model = make_model(arch).train()
    ids = torch.randint(0, 101, (2, 24))
    model.core.settings = SolverSettings(max_iter=4, gradient="unrolled_damped", damping=0.8)
    got = gradients(model, ids)
    got_logits = model(ids).detach()

    def by_hand(input_ids):
        x = model.embedding(input_ids)
        inj = model.core.injection(x)
        z = model.core.backbone(torch.zeros_like(x), inj)
        for _ in range(3):
            z = 0.2 * z + 0.8 * model.core.backbone(z, inj)
        return model.logits(z)

    model.forward = by_hand
    want = gradients(model, ids)
    assert torch.allclose(got_logits, by_hand(ids).detach(), rtol=0, atol=1e-12)
    assert ((got - want).norm() / want.norm()).item() < 1e-12
    assert model.core.last_stats.phantom_passes == 4


def test_a_phantom_step_is_the_damped_update():
    """z <- (1 - lambda) z + lambda F(z), written out for F(z) = 3z + 1 from z = 2, lambda = 0.8."""
    from implicit_megatron.implicit.phantom import phantom_steps

    out = phantom_steps(lambda z: 3.0 * z + 1.0, torch.tensor([2.0], dtype=torch.float64), 2, 0.8)
    # z1 = 0.2 * 2 + 0.8 * 7 = 6.0; z2 = 0.2 * 6 + 0.8 * 19 = 16.4
    assert torch.allclose(out, torch.tensor([16.4], dtype=torch.float64), rtol=1e-14)
    undamped = phantom_steps(lambda z: 3.0 * z + 1.0, torch.tensor([2.0], dtype=torch.float64), 2, 1.0)
    assert undamped.item() == 22.0  # F(F(2)) = 3 * 7 + 1
