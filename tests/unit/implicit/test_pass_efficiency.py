"""The cheap pass: weight norm once per forward, buffers reused between passes, evaluation without
phantom steps, and the eager fallback where CUDA graphs are impossible (CPU)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.func import functional_call

from implicit_megatron.builder import weight_normed_layers
from implicit_megatron.config import AndersonSettings
from implicit_megatron.implicit import SolverSettings, weight_norm
from implicit_megatron.implicit.graphs import PassesWithGradient
from implicit_megatron.implicit.iteration import StopRule, iterate
from implicit_megatron.implicit.phantom import phantom_steps
from implicit_megatron.implicit.solver import solve


def normed_model(make_model, arch: str, **kwargs):
    model = make_model(arch, "implicit.weight_norm=true", **kwargs).train()
    with torch.no_grad():  # g away from ||v||, so that a wrong g or v gradient shows
        for layer in weight_normed_layers(model.core.backbone):
            layer.parametrizations.weight.original0.mul_(1.3)
    return model


def count_weight_norms(model) -> list[int]:
    calls = [0]
    for layer in weight_normed_layers(model.core.backbone):
        layer.parametrizations.weight.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def grads(model, ids) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(ids, labels=torch.roll(ids, -1, 1)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def uncached_reference(model, ids) -> dict[str, torch.Tensor]:
    """Today's computation before the cache: every pass normalises every weight again."""
    core, s = model.core, model.core.settings
    model.zero_grad(set_to_none=True)
    x = model.embedding(ids)
    inj = core.injection(x)

    def f(z):
        return core.backbone(z, inj)

    z_star, _ = solve(f, torch.zeros_like(x), s.max_iter, s.tol)
    z = phantom_steps(f, z_star, s.phantom_steps, s.damping)
    torch.nn.functional.cross_entropy(model.logits(z).flatten(0, 1), torch.roll(ids, -1, 1).flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_weight_norm_runs_once_per_forward_and_keeps_the_gradients(arch, make_model):
    model = normed_model(make_model, arch)
    model.core.settings = SolverSettings(max_iter=5, phantom_steps=3, damping=0.8)
    ids = torch.randint(0, 101, (2, 12))
    reference = uncached_reference(model, ids)
    calls = count_weight_norms(model)
    cached = grads(model, ids)
    layers = len(weight_normed_layers(model.core.backbone))
    assert calls[0] == 2 * layers  # once for the solve, once (with gradient) for the phantom steps
    assert set(cached) == set(reference)
    for name, g in reference.items():
        assert torch.allclose(cached[name], g, rtol=1e-10, atol=1e-13), name
    assert any(n.endswith("original0") for n in cached) and any(n.endswith("original1") for n in cached)


def test_activation_checkpointing_keeps_per_pass_weight_norm(make_model):
    model = normed_model(make_model, "mamba2")
    model.core.settings = SolverSettings(max_iter=3, phantom_steps=2, damping=0.8)
    ids = torch.randint(0, 101, (2, 12))
    reference = uncached_reference(model, ids)
    model.core.backbone.checkpoint_layers = True
    checkpointed = grads(model, ids)
    for name, g in reference.items():
        assert torch.allclose(checkpointed[name], g, rtol=1e-10, atol=1e-13), name


def test_passes_with_given_parameters_equal_the_module(arch, make_model):
    """What the gradient graphs capture: the phantom steps as a function of tensors standing for
    every parameter (g and v included: the weights are normalised once, inside, with gradient);
    the gradients reach those tensors, not the module's parameters."""
    model = normed_model(make_model, arch)
    core = model.core
    x = model.embedding(torch.randint(0, 101, (2, 10))).detach()
    z = torch.randn_like(x)
    inj = core.injection(x).detach().requires_grad_()
    params = dict(core.backbone.named_parameters())
    given = {f"backbone.{name}": p.detach().clone().requires_grad_() for name, p in params.items()}
    passes = PassesWithGradient(core.backbone, steps=3, damping=0.8)
    calls = count_weight_norms(model)
    out = functional_call(passes, given, (z, inj, None))
    assert calls[0] == len(weight_normed_layers(core.backbone))  # once per layer for all three passes
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), [inj, *given.values()])
    assert all(p.grad is None for p in model.parameters())
    layers = weight_normed_layers(core.backbone)
    with weight_norm.reading(layers, weight_norm.compute(layers)):
        expected_out = phantom_steps(lambda v: core.backbone(v, inj), z, 3, 0.8)
    expected = torch.autograd.grad((expected_out * w).sum(), [inj, *params.values()])
    assert torch.allclose(out, expected_out, rtol=0, atol=1e-13)
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    doubled = {**given, "backbone.norm_f.weight": 2 * given["backbone.norm_f.weight"]}
    with torch.no_grad():  # the given tensors are what the passes read
        assert not torch.allclose(functional_call(passes, doubled, (z, inj, None)), expected_out)


class StaticStep:
    """A pass that, like a replayed graph, writes F(z) and its residual into the same buffers
    every call and copies its input into a buffer of its own."""

    def __init__(self, f, like):
        self.f, self.z, self.out, self.res = f, torch.empty_like(like), torch.empty_like(like), None

    def __call__(self, z, need_residual):
        if z.data_ptr() != self.z.data_ptr():
            self.z.copy_(z)
        f_z = self.f(self.z)
        self.out.copy_(f_z)
        residual = torch.linalg.vector_norm((f_z - self.z).flatten(1), dim=1) / \
            torch.linalg.vector_norm(f_z.flatten(1), dim=1)
        self.res = residual if self.res is None else self.res.copy_(residual)
        return self.out, self.res, None


@pytest.mark.parametrize("tol,anderson", [(None, False), (1e-9, False), (1e-9, True), (1e-30, False)])
def test_solver_over_reused_buffers_takes_the_same_passes(tol, anderson):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(16, 16, generator=g, dtype=torch.float64) * 0.15
    b = torch.randn(3, 16, generator=g, dtype=torch.float64)

    def f(z):
        return torch.tanh(z @ A.T + b)

    z0 = torch.zeros(3, 16, dtype=torch.float64)
    settings = AndersonSettings(enabled=anderson)
    eager_z, eager = solve(f, z0, 40, tol, settings)
    with torch.no_grad():
        solution = iterate(StaticStep(f, z0), z0, StopRule(40, tol, keep="lowest", anderson=settings))
    static_z, static = solution.z, solution.stats
    assert static.passes == eager.passes and (tol is None or eager.passes > 1)
    assert torch.allclose(static_z, eager_z, rtol=0, atol=1e-14)
    assert torch.allclose(static.residual, eager.residual, rtol=1e-10)
    assert torch.equal(static.converged, eager.converged)


def test_evaluation_by_the_solver_rule_returns_the_fixed_point_without_phantom_steps(arch, make_model):
    model = make_model(arch, contractive=True)
    model.core.settings = SolverSettings(max_iter=30, tol=1e-6, phantom_steps=4, eval_factor=1, eval_rule="solver",
                                         eval_stop="batch")  # one stop test, as solve() below
    x = model.embedding(torch.randint(0, 101, (2, 9))).detach()
    with torch.no_grad():
        z = model.eval().core(x)
        assert model.core.last_stats.phantom_passes == 0
        inj = model.core.injection(x)
        z_star, stats = solve(lambda v: model.core.backbone(v, inj), torch.zeros_like(x), 30, 1e-6)
        assert torch.equal(z, z_star) and stats.passes == model.core.last_stats.passes
        model.train().core(x)
        assert model.core.last_stats.phantom_passes == 4


def test_cpu_falls_back_to_eager_with_one_log_line_at_info_level(make_model, caplog):
    """Without a GPU, graphs are not missed: one line at info level (a launch or a tool prints no
    warning about them), and `on` is an error."""
    model = make_model("llama")
    assert model.core.cuda_graphs == "auto"
    ids = torch.randint(0, 101, (1, 6))
    with caplog.at_level(logging.INFO, logger="implicit_megatron.implicit.graph_runtime"):
        for _ in range(3):
            model(ids)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "CUDA graphs" in r.getMessage()]
    assert lines == [("INFO", "CUDA graphs off: the tensors are on cpu; the passes run eagerly")]
    model.core.cuda_graphs = "on"
    with pytest.raises(RuntimeError, match="cuda_graphs=on, but the tensors are on cpu"):
        model(ids)
    model.core.cuda_graphs = "off"
    caplog.clear()
    model(ids)
    assert not caplog.records


def test_the_phantom_cache_is_scoped_to_the_forward(make_model):
    """Outside a forward every access recomputes the weight (an optimizer step changes g and v)."""
    model = normed_model(make_model, "mamba2")
    model(torch.randint(0, 101, (1, 5)))
    layer = weight_normed_layers(model.core.backbone)[0]
    before = layer.weight
    with torch.no_grad():
        layer.parametrizations.weight.original0.mul_(2.0)
    assert all(layer.__dict__.get("_weight_value") is None for layer in weight_normed_layers(model.core.backbone))
    assert torch.allclose(layer.weight, 2.0 * before)
