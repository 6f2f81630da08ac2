"""The fused-kernel code paths, driven on CPU by stand-ins with the kernels' signatures and semantics.

The real kernels need a GPU (tools/node/validate_kernels.py compares them there). These stand-ins are
written as plain recurrences, independent of models/ssd.py; they check that the mixer passes the
kernels the right layouts and arguments, and that in-place kernel updates never reach the caller's
state (the stand-in updates mutate their state argument, as the real ones do).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from implicit_megatron.models import kernels
from implicit_megatron.models.llama import LlamaDecoderLayer
from implicit_megatron.models.mamba2 import Mamba2


def _act(y, activation):
    return F.silu(y) if activation in ("silu", "swish") else y


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):
    b, d, t = x.shape
    w = weight.shape[1]
    xp = F.pad(x, (w - 1, 0))
    sp = None if seq_idx is None else F.pad(seq_idx, (w - 1, 0), value=-1)
    y = torch.zeros_like(x)
    for j in range(w):
        term = weight[:, j, None] * xp[..., j:j + t]
        if sp is not None:
            term = term * (sp[:, j:j + t] == seq_idx)[:, None]
        y = y + term
    return _act(y if bias is None else y + bias[:, None], activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
    conv_state.copy_(torch.cat([conv_state[..., 1:], x[..., None]], dim=-1))
    y = (conv_state * weight).sum(-1)
    return _act(y if bias is None else y + bias, activation)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                              seq_idx=None, dt_limit=(0.0, float("inf"))):
    b, t, h, p = x.shape
    if dt_bias is not None:
        dt = dt + dt_bias
    dt = (F.softplus(dt) if dt_softplus else dt).clamp(*dt_limit)
    Bh, Ch = (v.repeat_interleave(h // v.shape[2], dim=2) for v in (B, C))
    S, ys = torch.zeros(b, h, p, B.shape[-1]), []
    for i in range(t):
        if seq_idx is not None and i > 0:
            S = S * (seq_idx[:, i] == seq_idx[:, i - 1])[:, None, None, None]
        S = torch.exp(dt[:, i] * A)[..., None, None] * S + (dt[:, i, :, None] * x[:, i])[..., None] * Bh[:, i, :, None]
        y = (S * Ch[:, i, :, None]).sum(-1)
        ys.append(y + (D[:, None] if D.dim() == 1 else D) * x[:, i])
    return torch.stack(ys, 1)


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=None,
                                     dt_limit=(0.0, float("inf")), activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True):
    nheads = dt_bias.shape[0]
    headdim = D.shape[-1] if headdim is None else headdim
    dim = nheads * headdim
    dstate = (zxbcdt.shape[-1] - 2 * dim - nheads) // ngroups // 2
    z, xbc, dt = zxbcdt.split([dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    xbc = causal_conv1d_fn(xbc.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx, activation).transpose(1, 2)
    x, B, C = xbc.split([dim, ngroups * dstate, ngroups * dstate], dim=-1)
    b, t = zxbcdt.shape[:2]
    y = mamba_chunk_scan_combined(x.unflatten(-1, (nheads, headdim)), dt, A, B.unflatten(-1, (ngroups, dstate)),
                                  C.unflatten(-1, (ngroups, dstate)), chunk_size, D=D, dt_bias=dt_bias,
                                  dt_softplus=True, seq_idx=seq_idx, dt_limit=dt_limit).reshape(b, t, dim)
    if not norm_before_gate:
        y = y * F.silu(z)
    g = y.unflatten(-1, (ngroups, dim // ngroups))
    y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + rmsnorm_eps)).flatten(-2) * rmsnorm_weight
    if norm_before_gate:
        y = y * F.silu(z)
    return F.linear(y, outproj_weight, outproj_bias)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    h = state.shape[1]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    Bh, Ch = (v.repeat_interleave(h // v.shape[1], dim=1) for v in (B, C))
    state.copy_(state * torch.exp(dt[..., None] * A) + (dt * x)[..., None] * Bh[:, :, None])
    return (state * Ch[:, :, None]).sum(-1) + D * x


STAND_INS = kernels.MambaKernels(mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined,
                                 selective_state_update, causal_conv1d_fn, causal_conv1d_update)


@pytest.fixture
def fused(monkeypatch):
    """Make every mixer believe its tensors are on a GPU with the kernels installed."""
    monkeypatch.setattr(kernels, "mamba_kernels", lambda x: STAND_INS if kernels.kernels_enabled() else None)


@pytest.mark.parametrize("mem_eff", [True, False])
@pytest.mark.parametrize("with_seq_idx", [False, True])
def test_mixer_fused_forward_equals_pytorch_path(fused, mem_eff, with_seq_idx, rel_err):
    m = Mamba2(32, d_state=8, headdim=8, ngroups=2, chunk_size=16, use_mem_eff_path=mem_eff)
    u = torch.randn(2, 21, 32)
    inj = torch.randn(2, 21, m.injection_width) * 0.3
    seq_idx = torch.tensor([0] * 8 + [1] * 13, dtype=torch.int32).expand(2, -1) if with_seq_idx else None
    with torch.no_grad():
        y_fused = m(u, inj, seq_idx)
        kernels.set_kernels_enabled(False)
        try:
            y_torch = m(u, inj, seq_idx)
        finally:
            kernels.set_kernels_enabled(True)
    assert rel_err(y_fused, y_torch) < 1e-12


def test_mixer_fused_step_equals_pytorch_path_and_leaves_state_alone(fused, rel_err):
    m = Mamba2(32, d_state=8, headdim=8, ngroups=2, chunk_size=16)
    u = torch.randn(2, 7, 32)
    with torch.no_grad():
        y = m(u)
        state, outs = m.allocate_state(2), []
        for i in range(7):
            conv, ssm = state.conv.clone(), state.ssm.clone()
            m.step(torch.randn(2, 32), state)  # a discarded candidate
            out, new = m.step(u[:, i], state)
            assert torch.equal(state.conv, conv) and torch.equal(state.ssm, ssm)
            outs.append(out)
            state = new
    assert rel_err(torch.stack(outs, 1), y) < 1e-12


def test_llama_flash_attention_path(monkeypatch, rel_err):
    def flash_attn_func(q, k, v, causal=False):
        rep = q.shape[2] // k.shape[2]
        q, k, v = (x.transpose(1, 2) for x in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)

    layer = LlamaDecoderLayer(32, 4, 48, n_kv_heads=2)
    z = torch.randn(2, 11, 32)
    with torch.no_grad():
        y_torch = layer(z)
        monkeypatch.setattr(kernels, "flash_attn", lambda x: flash_attn_func)
        y_flash = layer(z)
    assert rel_err(y_flash, y_torch) < 1e-12


@pytest.mark.parametrize("user_setting", [None, "0"])
def test_the_kernels_keep_their_autotuning_on_disk_unless_the_user_says_otherwise(monkeypatch, user_setting):
    """mamba_ssm's kernels autotune in every process anew (minutes on a fresh node) unless Triton
    caches the choices, which it reads when the kernels are imported."""
    import os

    if user_setting is None:
        monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    else:
        monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", user_setting)
    kernels._load_mamba_kernels.cache_clear()
    try:
        kernels._load_mamba_kernels()
        assert os.environ["TRITON_CACHE_AUTOTUNING"] == (user_setting or "1")
    finally:
        kernels._load_mamba_kernels.cache_clear()
