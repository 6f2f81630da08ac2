"""The chunked head + cross-entropy against F.cross_entropy on whole float32/float64 logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from implicit_megatron import build_model, load_config
from implicit_megatron.models.loss import linear_cross_entropy

ROOT = Path(__file__).resolve().parents[3]


def reference(z, weight, labels):
    logits = (z @ weight.t()).to(torch.promote_types(z.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("chunk", [1, 7, 16, 111, 4096])  # token counts below, at and across chunk edges
def test_value_and_gradients_equal_the_plain_loss_in_float64(chunk):
    g = torch.Generator().manual_seed(chunk)
    z = torch.randn(3, 37, 16, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(101, 16, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, 101, (3, 37), generator=g)
    labels[0, :5] = -100  # ignored positions count in neither the sum nor the mean
    expected = reference(z, weight, labels)
    want = torch.autograd.grad(2.5 * expected, (z, weight))
    loss = linear_cross_entropy(z, weight, labels, chunk_tokens=chunk)
    got = torch.autograd.grad(2.5 * loss, (z, weight))
    assert loss.dtype == torch.float64 and abs(loss.item() - expected.item()) < 1e-12
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-12


def test_bfloat16_within_rounding_and_float32_loss():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 50, 32, generator=g).bfloat16().requires_grad_()
    weight = (0.2 * torch.randn(300, 32, generator=g)).bfloat16().requires_grad_()
    labels = torch.randint(0, 300, (4, 50), generator=g)
    expected = reference(z, weight, labels)
    want = torch.autograd.grad(expected, (z, weight))
    loss = linear_cross_entropy(z, weight, labels, chunk_tokens=64)
    got = torch.autograd.grad(loss, (z, weight))
    assert loss.dtype == torch.float32 and abs(loss.item() - expected.item()) < 1e-5 * expected.item()
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16 and rel(a, b) < 2e-2


def test_without_gradients_it_only_measures():
    z, weight = torch.randn(2, 9, 8), torch.randn(20, 8)
    labels = torch.randint(0, 20, (2, 9))
    with torch.no_grad():
        assert torch.allclose(linear_cross_entropy(z, weight, labels, chunk_tokens=4), reference(z, weight, labels))
    loss = linear_cross_entropy(z, weight, labels)  # nothing requires grad: a plain tensor
    assert loss.grad_fn is None


def test_model_with_labels_returns_the_loss_of_its_logits():
    cfg = load_config(ROOT / "configs/tiny/llama-implicit.yaml", ["model.vocab_size=97"], check_files=False)
    torch.manual_seed(0)
    model = build_model(cfg).double().train()
    ids = torch.randint(0, 97, (2, 11))
    labels = torch.roll(ids, -1, 1)
    model.zero_grad()
    F.cross_entropy(model(ids).flatten(0, 1), labels.flatten()).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(ids, labels=labels).backward()
    for name, p in model.named_parameters():
        assert rel(p.grad, want[name]) < 1e-10, name
