"""Weight normalisation: W = g * v / ||v||, the norm over every dimension but the first (each output
row, or each output channel of a convolution), against the formula written out here."""

from __future__ import annotations

import torch

from implicit_megatron.implicit.weight_norm import normalise


def test_each_row_is_scaled_to_its_own_g():
    g = torch.tensor([[2.0], [0.5], [3.0]], dtype=torch.float64)
    v = torch.randn(3, 4, dtype=torch.float64)
    expected = g * v / v.norm(dim=1, keepdim=True)
    assert torch.allclose(normalise(g, v), expected, rtol=1e-14, atol=0)
    assert torch.allclose(normalise(g, v).norm(dim=1), g.squeeze(1), rtol=1e-14)  # row norms are g


def test_a_convolution_is_normalised_per_output_channel():
    g = torch.rand(5, 1, 1, dtype=torch.float64) + 0.5
    v = torch.randn(5, 1, 4, dtype=torch.float64)  # Conv1d: (out, in / groups, kernel)
    expected = g * v / v.flatten(1).norm(dim=1).view(5, 1, 1)
    assert torch.allclose(normalise(g, v), expected, rtol=1e-14, atol=0)
