"""causal_conv1d's stand-in (support.causal_conv1d_stand_in) against an independent float64
reference written from causal_conv1d 1.7.0's documented semantics: out[t] = sum_k w[k] x[t - W + 1 + k]
over the taps of the same document, zero at padding (seq_idx < 0), SiLU after the bias; its
backward checked by finite differences; `update` shifts the state in place."""

from __future__ import annotations

import pytest
import torch
from support import causal_conv1d_stand_in as cc

TOLERANCE = 1e-12  # float64 on both sides


def reference(x, weight, bias, seq_idx, silu):
    batch, dim, length = x.shape
    width = weight.shape[1]
    out = torch.zeros_like(x)
    for b in range(batch):
        for t in range(length):
            for k in range(width):
                s = t - width + 1 + k
                if s >= 0 and (seq_idx is None or seq_idx[b, s] == seq_idx[b, t]):
                    out[b, :, t] += weight[:, k] * x[b, :, s]
    out = out + bias[:, None]
    out = torch.nn.functional.silu(out) if silu else out
    if seq_idx is not None:
        out = out * (seq_idx >= 0)[:, None]
    return out


@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("packed", [True, False])
def test_the_forward_is_the_reference(silu, packed):
    g = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((2, 5, 9), (5, 4), (5,)))
    seq_idx = torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2, 2], [-1, -1, 0, 0, 0, 0, 0, 1, 1]], dtype=torch.int32) \
        if packed else None
    got = cc.causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, activation="silu" if silu else None)
    assert (got - reference(x, weight, bias, seq_idx, silu)).abs().max() < TOLERANCE


def test_the_backward_is_the_forwards_derivative_and_fills_the_given_dx():
    g = torch.Generator().manual_seed(1)
    x, weight, bias = (torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
                       for shape in ((2, 3, 7), (3, 4), (3,)))
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda *a: cc.causal_conv1d_fn(*a, seq_idx=seq_idx, activation="silu"),
                                     (x, weight, bias))
    dout = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    given = torch.empty(2, 3, 7, dtype=torch.float64)
    dx, dweight, dbias, _ = cc.causal_conv1d_bwd_function(x.detach(), weight.detach(), bias.detach(), dout, seq_idx,
                                                          None, None, given, False, True)
    expected = torch.autograd.grad(reference(x, weight, bias, seq_idx, True), (x, weight, bias), dout)
    assert dx is given
    for got, want in zip((dx, dweight, dbias), expected, strict=True):
        assert (got - want).abs().max() < TOLERANCE


def test_update_shifts_the_state_in_place_and_convolves_the_window():
    g = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    xs = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    state = torch.zeros(2, 3, 4, dtype=torch.float64)
    outs = [cc.causal_conv1d_update(xs[..., t], state, weight, bias, activation="silu") for t in range(6)]
    assert (torch.stack(outs, -1) - reference(xs, weight, bias, None, True)).abs().max() < TOLERANCE
    assert torch.equal(state, xs[..., -4:])


def test_unused_conv_states_are_refused():
    x, weight = torch.randn(1, 2, 3), torch.randn(2, 4)
    with pytest.raises(NotImplementedError, match="not used"):
        cc.causal_conv1d_fn(x, weight, initial_states=torch.zeros(1, 2, 3))
