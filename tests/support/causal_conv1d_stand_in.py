"""causal_conv1d's Python entry points over a PyTorch depthwise convolution (the kernel tier's stand-in).

causal_conv1d is CUDA C++ only, so the kernel tier cannot run it on a CPU. mamba_ssm's fused Mamba2
path calls it by these names and signatures: `causal_conv1d_fn` and `causal_conv1d_update` (package
level), and `causal_conv1d.cpp_functions.causal_conv1d_{fwd,bwd,update}_function` (the split conv +
scan kernel's forward and backward). Semantics as causal_conv1d 1.7.0 documents them: a tap that
reaches into another document (another `seq_idx`) reads zero, a token of a negative `seq_idx`
(padding) outputs zero, `bwd` writes its input gradient into a `dx` it is given, and `update`
shifts the new column into `conv_state` in place. Initial and final conv states are not used by
the project and are refused. tests/kernels/test_causal_conv1d_stand_in.py checks it against an
independent float64 reference.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F


def _refuse_states(*states: object) -> None:
    if any(s is not None and s is not False for s in states):
        raise NotImplementedError("initial and final conv states are not used by the project's Mamba2 mixer")


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
          silu: bool) -> torch.Tensor:
    """x (batch, dim, seqlen), weight (dim, width) -> (batch, dim, seqlen), computed in float32 at least."""
    width, length = weight.shape[1], x.shape[-1]
    compute = torch.promote_types(x.dtype, torch.float32)
    xp = F.pad(x.to(compute), (width - 1, 0))
    taps = [weight[:, j, None].to(compute) * xp[..., j:j + length] for j in range(width)]
    if seq_idx is not None:
        ids = F.pad(seq_idx, (width - 1, 0), value=-1)  # before the sequence: no document
        taps = [tap * (ids[:, j:j + length] == seq_idx)[:, None] for j, tap in enumerate(taps)]
    out = torch.stack(taps).sum(0)
    if bias is not None:
        out = out + bias[:, None].to(compute)
    out = F.silu(out) if silu else out
    if seq_idx is not None:
        out = out.masked_fill((seq_idx < 0)[:, None], 0.0)
    return out.to(x.dtype)


def causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
    _refuse_states(initial_states, final_states_out)
    return _conv(x, weight, bias, seq_idx, silu_activation)


def causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                               return_dinitial_states, silu_activation):
    _refuse_states(initial_states, dfinal_states, return_dinitial_states)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (x, weight) + ((bias,) if bias is not None else ())]
        out = _conv(leaves[0], leaves[1], leaves[2] if bias is not None else None, seq_idx, silu_activation)
        grads = torch.autograd.grad(out, leaves, dout)
    if dx is None:
        dx = torch.empty_like(x)
    dx.copy_(grads[0])  # the C++ kernel writes into the dx it is given (mamba_ssm passes a view of its buffer)
    return dx, grads[1].type_as(weight), grads[2].type_as(bias) if bias is not None else None, None


def causal_conv1d_update_function(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices):
    _refuse_states(cache_seqlens, conv_state_indices)
    width, length = weight.shape[1], x.shape[-1]
    window = torch.cat([conv_state, x.to(conv_state.dtype)], dim=-1)
    conv_state.copy_(window[..., -conv_state.shape[-1]:])
    out = _conv(window[..., -(width - 1 + length):], weight, bias, None, silu_activation)
    return out[..., width - 1:].to(x.dtype)


class _CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, silu):
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.silu = silu
        return causal_conv1d_fwd_function(x, weight, bias, seq_idx, None, None, silu)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, seq_idx = ctx.saved_tensors
        dx, dweight, dbias, _ = causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, None, None, None, False,
                                                           ctx.silu)
        return dx, dweight, dbias, None, None


def _silu(activation: str | None) -> bool:
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")
    return activation is not None


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    _refuse_states(initial_states, return_final_states, final_states_out)
    return _CausalConv1d.apply(x, weight, bias, seq_idx, _silu(activation))


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    one = x.dim() == 2
    out = causal_conv1d_update_function(x[..., None] if one else x, conv_state, weight, bias, _silu(activation),
                                        cache_seqlens, conv_state_indices)
    return out[..., 0] if one else out


def modules() -> dict[str, types.ModuleType]:
    """The modules `causal_conv1d` and `causal_conv1d.cpp_functions`, for sys.modules."""
    package = types.ModuleType("causal_conv1d")
    cpp = types.ModuleType("causal_conv1d.cpp_functions")
    here = sys.modules[__name__]
    for name in ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_update_function"):
        setattr(cpp, name, getattr(here, name))
    package.causal_conv1d_fn, package.causal_conv1d_update = causal_conv1d_fn, causal_conv1d_update
    package.cpp_functions = cpp
    package.__version__ = "stand-in"
    return {"causal_conv1d": package, "causal_conv1d.cpp_functions": cpp}
