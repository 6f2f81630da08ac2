"""Mamba2 mixer against transformers' Mamba2Mixer (mamba_ssm's parameter names) in float64."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

from implicit_megatron.models.mamba2 import Mamba2

D_MODEL, D_STATE, HEADDIM, CHUNK = 32, 16, 8, 16


def pair(ngroups: int = 1) -> tuple[Mamba2Mixer, Mamba2]:
    """transformers' mixer with random weights, and ours loaded from its state dict (strict)."""
    cfg = Mamba2Config(hidden_size=D_MODEL, num_heads=2 * D_MODEL // HEADDIM, head_dim=HEADDIM, state_size=D_STATE,
                       expand=2, n_groups=ngroups, chunk_size=CHUNK, conv_kernel=4, num_hidden_layers=1,
                       layer_norm_epsilon=1e-5)
    ref = Mamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
    ours = Mamba2(D_MODEL, d_state=D_STATE, headdim=HEADDIM, ngroups=ngroups, chunk_size=CHUNK)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def test_parameter_names_and_shapes_are_mamba_ssm_s():
    ref, ours = pair(ngroups=2)
    expected = {"in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight",
                "out_proj.weight"}
    assert set(ours.state_dict()) == expected
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    nheads = 2 * D_MODEL // HEADDIM
    assert ours.in_proj.weight.shape == (2 * 2 * D_MODEL + 2 * 2 * D_STATE + nheads, D_MODEL)
    assert ours.injection_width == ours.in_proj.out_features


@pytest.mark.parametrize("ngroups", [1, 2])
@pytest.mark.parametrize("t", [CHUNK, 2 * CHUNK, 37, 5])
def test_forward_matches_transformers(ngroups, t, rel_err, float64_reference):
    ref, ours = pair(ngroups)
    u = torch.randn(2, t, D_MODEL)
    with torch.no_grad():
        y = ours(u)
        y_ref_as_is = ref(u)  # transformers runs its scan and norms in float32
        with float64_reference:
            y_ref = ref(u)
    assert rel_err(y, y_ref) < 1e-10
    assert rel_err(y, y_ref_as_is) < 1e-6


def test_gradients_match_transformers(rel_err, float64_reference):
    ref, ours = pair(ngroups=2)
    u = torch.randn(2, 37, D_MODEL)
    w = torch.randn(2, 37, D_MODEL)
    (ours(u) * w).sum().backward()
    with float64_reference:
        (ref(u) * w).sum().backward()
    grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, grads[name].grad) < 1e-10, name


@pytest.mark.parametrize("ngroups", [1, 2])
def test_step_token_by_token_equals_forward(ngroups, rel_err):
    _, ours = pair(ngroups)
    u = torch.randn(3, 21, D_MODEL)
    inj = torch.randn(3, 21, ours.injection_width) * 0.3
    with torch.no_grad():
        y = ours(u, inj)
        state = ours.allocate_state(3)
        outs = []
        for i in range(u.shape[1]):
            out, state = ours.step(u[:, i], state, inj[:, i])
            outs.append(out)
    assert rel_err(torch.stack(outs, 1), y) < 1e-12


def test_step_is_functional(rel_err):
    """Stepping one committed state with many candidates changes nothing; any candidate can be kept."""
    _, ours = pair()
    u = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        y = ours(u)
        state = ours.allocate_state(2)
        for i in range(8):
            state = ours.step(u[:, i], state)[1]
        frozen = (state.conv.clone(), state.ssm.clone())
        for _ in range(3):  # other candidates for token 8, discarded
            ours.step(torch.randn(2, D_MODEL), state)
        assert torch.equal(state.conv, frozen[0]) and torch.equal(state.ssm, frozen[1])
        out, _ = ours.step(u[:, 8], state)
    assert rel_err(out, y[:, 8]) < 1e-12


def test_injection_shifts_the_in_proj_output(rel_err, float64_reference):
    """Ours with `inj` equals transformers' mixer whose in_proj output is shifted by inj (a hook)."""
    ref, ours = pair(ngroups=2)
    u = torch.randn(2, 37, D_MODEL)
    inj = torch.randn(2, 37, ours.injection_width)
    handle = ref.in_proj.register_forward_hook(lambda module, args, out: out + inj)
    with torch.no_grad(), float64_reference:
        y_ref = ref(u)
    handle.remove()
    with torch.no_grad():
        y = ours(u, inj=inj)
        y_plain = ours(u)
    assert rel_err(y, y_ref) < 1e-10
    assert rel_err(y, y_plain) > 1e-3


def test_seq_idx_isolates_packed_documents(rel_err):
    _, ours = pair(ngroups=2)
    # per sample: documents crossing chunk boundaries, boundaries inside chunks, one on a chunk edge
    layouts = [[11, 30, 6], [16, 31]]
    u = torch.randn(2, 47, D_MODEL)
    seq_idx = torch.stack([torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])
                           for lengths in layouts])
    with torch.no_grad():
        packed = ours(u, seq_idx=seq_idx)
        shared = ours(u)
        for row, lengths in enumerate(layouts):
            start = 0
            for n in lengths:
                alone = ours(u[row:row + 1, start:start + n])
                assert rel_err(packed[row:row + 1, start:start + n], alone) < 1e-12
                start += n
    assert rel_err(shared[0, 11:41], packed[0, 11:41]) > 1e-3  # without seq_idx state does flow


def test_initialisation_follows_mamba_ssm():
    m = Mamba2(64, d_state=16, headdim=16, dt_min=0.002, dt_max=0.05, A_init_range=(2, 8))
    dt = torch.nn.functional.softplus(m.dt_bias)
    assert dt.min() >= 0.002 - 1e-9 and dt.max() <= 0.05 + 1e-9
    A = torch.exp(m.A_log)
    assert A.min() >= 2 and A.max() <= 8
    assert torch.equal(m.D, torch.ones(m.nheads))
    assert all(getattr(p, "_no_weight_decay", False) for p in (m.dt_bias, m.A_log, m.D))
    bound = 1 / math.sqrt(m.d_inner)  # nn.Linear default: kaiming-uniform(a=sqrt(5))
    assert m.out_proj.weight.abs().max() <= bound


def test_variants_d_has_hdim_and_norm_before_gate_step_consistently(rel_err):
    m = Mamba2(D_MODEL, d_state=D_STATE, headdim=HEADDIM, chunk_size=CHUNK, D_has_hdim=True,
               norm_before_gate=True, dt_limit=(0.01, 0.2))
    u = torch.randn(2, 19, D_MODEL)
    with torch.no_grad():
        y = m(u)
        state, outs = m.allocate_state(2), []
        for i in range(19):
            out, state = m.step(u[:, i], state)
            outs.append(out)
    assert m.D.shape == (m.d_inner,)
    assert rel_err(torch.stack(outs, 1), y) < 1e-12
