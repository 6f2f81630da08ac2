"""CUDA graphs of the passes against the eager passes (GPU only; skipped where there is none), and
the eager fallback when a capture fails (any machine)."""

from __future__ import annotations

import logging

import pytest
import torch

from implicit_megatron.builder import weight_normed_layers
from implicit_megatron.implicit import SolverSettings
from implicit_megatron.implicit import graphs as graphs_lib
from implicit_megatron.models.loss import linear_cross_entropy

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def gpu_model(make_model, arch: str, dtype: torch.dtype, *overrides: str):
    model = make_model(arch, "implicit.weight_norm=true", "model.vocab_size=512", *overrides, contractive=True)
    with torch.no_grad():
        for layer in weight_normed_layers(model.core.backbone):
            layer.parametrizations.weight.original0.mul_(1.1)
    return model.to(device="cuda", dtype=dtype).train()


def step(model, ids, graphs: str):
    """Loss, every gradient, and the solver's statistics of one training step."""
    model.core.cuda_graphs = graphs
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=torch.roll(ids, -1, 1))
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, model.core.last_stats


def close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item() < TOLERANCE[dtype]


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("settings", [SolverSettings(max_iter=4, phantom_steps=1),
                                      SolverSettings(max_iter=24, phantom_steps=4),
                                      SolverSettings(max_iter=40, tol=2e-2, phantom_steps=2),
                                      None], ids=["(4+1)", "(24+4)", "free", "explicit"])
def test_graphed_step_equals_the_eager_step(arch, make_model, dtype, settings):
    model = gpu_model(make_model, arch, dtype)
    model.core.settings = settings
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    eager_loss, eager_grads, eager_stats = step(model, ids, "off")
    for _ in range(3):  # capture, then replays with the same inputs
        loss, grads, stats = step(model, ids, "on")
    assert abs(loss - eager_loss) <= TOLERANCE[dtype] * abs(eager_loss)
    assert set(grads) == set(eager_grads)
    for name, g in eager_grads.items():
        assert close(grads[name], g, dtype), name
    if settings is not None:
        assert stats.passes == eager_stats.passes  # the free phase stops where the eager solver stops
        assert model.core._graphs, "the graphed step ran eagerly"


@cuda
def test_graphs_follow_the_optimizer_and_new_inputs(make_model):
    """Parameters updated in place and new batches reach the replayed graphs."""
    model = gpu_model(make_model, "mamba2", torch.float32)
    model.core.settings = SolverSettings(max_iter=4, phantom_steps=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(3):
        ids = torch.randint(0, 512, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(i))
        eager_loss, _, _ = step(model, ids, "off")
        loss, _, _ = step(model, ids, "on")
        assert abs(loss - eager_loss) <= 1e-4 * abs(eager_loss)
        optimizer.step()


@cuda
def test_evaluation_graphs_equal_eager(arch, make_model):
    model = gpu_model(make_model, arch, torch.float32).eval()
    model.core.settings = SolverSettings(max_iter=8, tol=2e-2, phantom_steps=4, eval_factor=4)
    ids = torch.randint(0, 512, (3, 64), device="cuda")
    with torch.no_grad():
        model.core.cuda_graphs = "off"
        eager = model(ids)
        passes = model.core.last_stats.passes
        model.core.cuda_graphs = "on"
        graphed = [model(ids) for _ in range(2)][-1]
    assert model.core.last_stats.passes == passes
    assert close(graphed, eager, torch.float32)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_equals_float32_logits_on_the_gpu(dtype):
    z = torch.randn(4, 700, 64, device="cuda", dtype=dtype, requires_grad=True)
    weight = (0.1 * torch.randn(5000, 64, device="cuda", dtype=dtype)).requires_grad_()
    labels = torch.randint(0, 5000, (4, 700), device="cuda")
    ref = torch.nn.functional.cross_entropy((z @ weight.t()).float().flatten(0, 1), labels.flatten())
    ref_z, ref_w = torch.autograd.grad(ref, (z, weight))
    loss = linear_cross_entropy(z, weight, labels, chunk_tokens=1000)
    got_z, got_w = torch.autograd.grad(loss, (z, weight))
    assert abs(loss.item() - ref.item()) <= 1e-5 * ref.item()
    assert close(got_z.float(), ref_z.float(), dtype) and close(got_w.float(), ref_w.float(), dtype)


def test_a_failed_capture_runs_eagerly_and_says_why(make_model, monkeypatch, caplog):
    model = make_model("mamba2")
    model.core.settings = SolverSettings(max_iter=3, phantom_steps=1)
    ids = torch.randint(0, 101, (2, 8))
    model.core.cuda_graphs = "off"
    expected = model(ids, labels=ids)
    model.core.cuda_graphs = "auto"

    captures = []

    def refuse(*args, **kwargs):
        captures.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs_lib, "why_not", lambda *args: None)  # as on a GPU
    monkeypatch.setattr(graphs_lib, "SolverGraphs", refuse)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    with caplog.at_level(logging.WARNING, logger="implicit_megatron.implicit.core"):
        assert torch.equal(model(ids, labels=ids), expected)
        assert not captures  # a shape is captured when it recurs, not on its first forward
        assert torch.equal(model(ids, labels=ids), expected)
        assert len(captures) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "CUDA graph capture failed (RuntimeError: operation not permitted when stream is capturing); "
        "the passes run eagerly"]
    assert model.core.cuda_graphs == "off"
    model.core.cuda_graphs = "on"
    with pytest.raises(RuntimeError, match="stream is capturing"):
        model(ids)
