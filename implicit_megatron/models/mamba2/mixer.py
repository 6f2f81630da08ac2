"""The Mamba2 mixer: in_proj -> causal depthwise conv1d + SiLU -> SSD scan -> gated RMSNorm -> out_proj.

Constructor keywords, parameter names, shapes and initialisation are mamba_ssm's `Mamba2`, so state
dicts move unchanged between mamba_ssm, `transformers`' Mamba2Mixer and this module:

    in_proj.weight   (2*d_inner + 2*ngroups*d_state + nheads, d_model)   -> [z, x, B, C, dt]
    conv1d.weight    (conv_dim, 1, d_conv), conv1d.bias (conv_dim)        conv_dim = d_inner + 2*ngroups*d_state
    dt_bias, A_log   (nheads,)          D (nheads,) or (d_inner,) with D_has_hdim
    norm.weight      (d_inner,)         out_proj.weight (d_model, d_inner)

Two additions serve the implicit model: an injection `inj` added to the in_proj output before the
split (so it reaches z, the conv input and dt alike), and a functional `step` that returns a new
state instead of updating the one it was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from implicit_megatron.models import kernels
from implicit_megatron.models.mamba2.ssd import ssd_scan, ssd_step
from implicit_megatron.models.norms import GatedRMSNorm, as_dtype, compute_dtype


@dataclass(frozen=True)
class Mamba2State:
    """Recurrent state of one mixer after some tokens.

    conv: (B, conv_dim, d_conv) the last d_conv conv inputs, oldest first, in the model dtype;
    ssm:  (B, nheads, headdim, d_state) in at least float32.
    """

    conv: torch.Tensor
    ssm: torch.Tensor
    grows: ClassVar[bool] = False  # a constant size, whatever the tokens

    def with_room(self, tokens: int) -> Mamba2State:
        return self  # holds any number of tokens

    def select(self, rows: torch.Tensor, other: Mamba2State) -> Mamba2State:
        """Per row: this state where `rows` (B,) is true, else `other`."""
        return Mamba2State(torch.where(rows[:, None, None], self.conv, other.conv),
                           torch.where(rows[:, None, None, None], self.ssm, other.ssm))

    def commit(self, real: torch.Tensor, before: Mamba2State) -> Mamba2State:
        """The state after this token, which was padding where `real` (B,) is false: those rows keep
        the state they had `before` (padding never enters a row's recurrent state)."""
        return self.select(real, before)


class Mamba2(nn.Module):
    """mamba_ssm's Mamba2 mixer (same keywords; `d_ssm < d_inner` and tensor parallelism excepted).

    Extra keywords: `norm_eps` of the gated norm (mamba_ssm fixes 1e-5) and `use_kernels` (False:
    always the PyTorch path). `use_mem_eff_path` picks the single fused kernel over conv + scan.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        conv_init: float | None = None,
        expand: int = 2,
        headdim: int = 64,
        d_ssm: int | None = None,
        ngroups: int = 1,
        A_init_range: tuple[float, float] = (1, 16),
        D_has_hdim: bool = False,
        rmsnorm: bool = True,
        norm_before_gate: bool = False,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int = 256,
        use_mem_eff_path: bool = True,
        layer_idx: int | None = None,
        process_group=None,
        sequence_parallel: bool = True,
        norm_eps: float = 1e-5,
        use_kernels: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = expand * d_model
        if d_ssm is not None and d_ssm != self.d_inner:
            raise NotImplementedError("d_ssm < d_inner (a gated-MLP share of the mixer) is not supported")
        if process_group is not None:
            raise NotImplementedError("tensor-parallel Mamba2 is not supported; use data parallelism")
        if self.d_inner % headdim or (self.d_inner // headdim) % ngroups:
            raise ValueError(f"d_inner {self.d_inner} must split into heads of {headdim} and "
                             f"the heads into {ngroups} groups")
        self.headdim, self.ngroups = headdim, ngroups
        self.nheads = self.d_inner // headdim
        self.D_has_hdim, self.rmsnorm, self.norm_before_gate = D_has_hdim, rmsnorm, norm_before_gate
        self.dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
        self.chunk_size, self.use_mem_eff_path = chunk_size, use_mem_eff_path
        self.layer_idx, self.use_kernels = layer_idx, use_kernels
        self.conv_dim = self.d_inner + 2 * ngroups * d_state
        self.d_in_proj = 2 * self.d_inner + 2 * ngroups * d_state + self.nheads

        self.in_proj = nn.Linear(d_model, self.d_in_proj, bias=bias, **factory)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=d_conv, groups=self.conv_dim,
                                padding=d_conv - 1, bias=conv_bias, **factory)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)

        # dt = softplus(dt_raw + dt_bias) starts log-uniform in [dt_min, dt_max]: store softplus^-1(dt).
        dt = torch.exp(torch.rand(self.nheads, **factory) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        # A = -exp(A_log) with |A| uniform in A_init_range: per-head decay rates.
        if not 0 < A_init_range[0] <= A_init_range[1]:
            raise ValueError(f"A_init_range must be 0 < low <= high, got {A_init_range}")
        A = torch.empty(self.nheads, dtype=torch.float32, device=device).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A).to(dtype=dtype or torch.get_default_dtype()))
        # D is made in float32 at least (as mamba_ssm makes it) and float64 in a float64 model. An engine
        # that casts the whole module (DeepSpeed bf16) stores D, A_log and dt_bias in bf16 like every
        # parameter, with float32 masters in the optimizer; A, dt and the D skip are computed in float32
        # from them either way. tools/bench/bench_ssm_precision.py measured what the bf16 rounding costs: a
        # validation loss within 0.004 of keeping them float32, inside the run-to-run spread.
        d_dtype = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.D = nn.Parameter(torch.ones(self.d_inner if D_has_hdim else self.nheads, device=device, dtype=d_dtype))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True  # type: ignore[attr-defined]  # torch's stubs: no free attributes on a Tensor

        if rmsnorm:
            self.norm = GatedRMSNorm(self.d_inner, eps=norm_eps, group_size=self.d_inner // ngroups,
                                     norm_before_gate=norm_before_gate, **factory)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)

    # ------------------------------------------------------------------ helpers

    @property
    def injection_width(self) -> int:
        """Width of `inj`: the whole in_proj output [z, x, B, C, dt]."""
        return self.d_in_proj

    def _kernels(self, x: torch.Tensor) -> kernels.MambaKernels | None:
        return kernels.mamba_kernels(x) if self.use_kernels else None

    def _A(self) -> torch.Tensor:
        return -torch.exp(as_dtype(self.A_log, compute_dtype(self.A_log.dtype)))

    def _D(self) -> torch.Tensor:
        return self.D.view(self.nheads, self.headdim) if self.D_has_hdim else self.D

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        """Raw dt from in_proj -> positive step sizes (softplus of dt + dt_bias, clamped to dt_limit)."""
        cd = compute_dtype(dt.dtype)
        dt = F.softplus(as_dtype(dt, cd) + as_dtype(self.dt_bias, cd))
        if self.dt_limit != (0.0, float("inf")):
            dt = dt.clamp(*self.dt_limit)
        return dt

    def _dt_limit_kwargs(self) -> dict:
        return {} if self.dt_limit == (0.0, float("inf")) else {"dt_limit": self.dt_limit}

    def _gate_and_project(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = self.norm(y, z) if self.rmsnorm else y * F.silu(z)
        return self.out_proj(as_dtype(y, self.out_proj.weight.dtype))

    def _in_proj(self, u: torch.Tensor, inj: torch.Tensor | None) -> torch.Tensor:
        """in_proj(u) + inj; one matmul that adds inj in its epilogue (not a pass of its own over the
        widest activation of the layer) where there is no in_proj bias."""
        if inj is None:
            return self.in_proj(u)
        weight = self.in_proj.weight
        if self.in_proj.bias is not None:
            return self.in_proj(u) + as_dtype(inj, weight.dtype)
        flat = torch.addmm(as_dtype(inj, weight.dtype).reshape(-1, self.d_in_proj), u.reshape(-1, self.d_model),
                           weight.t())
        return flat.view(*u.shape[:-1], self.d_in_proj)

    def _split(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return zxbcdt.split([self.d_inner, self.conv_dim, self.nheads], dim=-1)

    def _split_xbc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gn = self.ngroups * self.d_state
        return xbc.split([self.d_inner, gn, gn], dim=-1)

    def _conv(self, xbc: torch.Tensor, seq_idx: torch.Tensor | None) -> torch.Tensor:
        """Causal depthwise conv + SiLU over (b, t, conv_dim) as a sum of its d_conv shifted taps (on a
        CPU, F.conv1d has no fast depthwise path in float64: 5x slower); taps never reach into an
        earlier document."""
        t, k = xbc.shape[1], self.d_conv
        weight, bias = self.conv1d.weight, self.conv1d.bias
        xp = F.pad(xbc, (0, 0, k - 1, 0))
        taps = [weight[:, 0, j] * xp[:, j:j + t] for j in range(k)]
        if seq_idx is not None:
            sp = F.pad(seq_idx, (k - 1, 0))  # the padded taps read zeros whatever their id
            taps = [tap * (sp[:, j:j + t] == seq_idx)[..., None].to(xbc.dtype) for j, tap in enumerate(taps)]
        y = cast(torch.Tensor, sum(taps))  # k >= 1 terms: a tensor
        if bias is not None:
            y = y + bias
        return F.silu(y)

    # ------------------------------------------------------------------ sequence

    def forward(self, u: torch.Tensor, inj: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        """u: (B, T, d_model); inj: (B, T, d_in_proj) added to in_proj(u); seq_idx: (B, T) int32 doc ids."""
        b, t, _ = u.shape
        zxbcdt = self._in_proj(u, inj)
        A = self._A()
        fused = self._kernels(u)
        if fused is not None and self.use_mem_eff_path:
            return fused.mamba_split_conv1d_scan_combined(
                zxbcdt, self.conv1d.weight.squeeze(1), self.conv1d.bias, self.dt_bias, A, D=self._D(),
                chunk_size=self.chunk_size, seq_idx=seq_idx, activation="silu",
                rmsnorm_weight=self.norm.weight if self.rmsnorm else None,
                rmsnorm_eps=self.norm.eps if self.rmsnorm else 1e-6,
                outproj_weight=self.out_proj.weight, outproj_bias=self.out_proj.bias,
                headdim=None if self.D_has_hdim else self.headdim, ngroups=self.ngroups,
                norm_before_gate=self.norm_before_gate, **self._dt_limit_kwargs())

        z, xbc, dt = self._split(zxbcdt)
        if fused is not None:
            xbc = fused.causal_conv1d_fn(xbc.transpose(1, 2), self.conv1d.weight.squeeze(1),
                                         self.conv1d.bias, seq_idx=seq_idx, activation="silu").transpose(1, 2)
        else:
            xbc = self._conv(xbc, seq_idx)
        x, B, C = self._split_xbc(xbc)
        x = x.reshape(b, t, self.nheads, self.headdim)
        B = B.reshape(b, t, self.ngroups, self.d_state)
        C = C.reshape(b, t, self.ngroups, self.d_state)
        if fused is not None:
            y = fused.mamba_chunk_scan_combined(x, dt, A, B, C, self.chunk_size, D=self._D(), z=None,
                                                dt_bias=self.dt_bias, dt_softplus=True, seq_idx=seq_idx,
                                                **self._dt_limit_kwargs())
        else:
            y = ssd_scan(x, self._dt(dt), A, B, C, self.chunk_size, D=self._D(), seq_idx=seq_idx)
        return self._gate_and_project(y.reshape(b, t, self.d_inner), z)

    # ------------------------------------------------------------------ one token

    def allocate_state(self, batch_size: int, device=None, dtype=None) -> Mamba2State:
        """Zero state before the first token (conv in `dtype`, SSM in at least float32)."""
        device = self.out_proj.weight.device if device is None else device
        dtype = self.out_proj.weight.dtype if dtype is None else dtype
        conv = torch.zeros(batch_size, self.conv_dim, self.d_conv, device=device, dtype=dtype)
        ssm = torch.zeros(batch_size, self.nheads, self.headdim, self.d_state, device=device,
                          dtype=compute_dtype(dtype))
        return Mamba2State(conv, ssm)

    def step(self, u_t: torch.Tensor, state: Mamba2State,
             inj_t: torch.Tensor | None = None) -> tuple[torch.Tensor, Mamba2State]:
        """One token: u_t (B, d_model), inj_t (B, d_in_proj) -> (out_t (B, d_model), new state).

        `state` is never modified (the kernels, which update in place, get copies), so the same state
        can be stepped many times with different inputs and only the chosen candidate kept.
        """
        b = u_t.shape[0]
        z, xbc, dt = self._split(self._in_proj(u_t, inj_t))
        A = self._A()
        fused = self._kernels(u_t)
        weight, bias = self.conv1d.weight[:, 0], self.conv1d.bias

        if fused is not None:
            conv = state.conv.clone()
            xbc = fused.causal_conv1d_update(xbc, conv, weight, bias, "silu")
        else:
            conv = torch.cat([state.conv[..., 1:], xbc[..., None].to(state.conv.dtype)], dim=-1)
            xbc = (conv * weight).sum(-1)
            if bias is not None:
                xbc = xbc + bias
            xbc = F.silu(xbc).to(u_t.dtype)
        x, B, C = self._split_xbc(xbc)
        x = x.reshape(b, self.nheads, self.headdim)
        B = B.reshape(b, self.ngroups, self.d_state)
        C = C.reshape(b, self.ngroups, self.d_state)

        if fused is not None and not self._dt_limit_kwargs():
            p, n = self.headdim, self.d_state
            ssm = state.ssm.clone()
            D = self._D()
            y = fused.selective_state_update(
                ssm, x, dt[..., None].expand(-1, -1, p), A[:, None, None].expand(-1, p, n), B, C,
                D if D.dim() == 2 else D[:, None].expand(-1, p), z=None,
                dt_bias=self.dt_bias[:, None].expand(-1, p), dt_softplus=True)
        else:
            y, ssm = ssd_step(state.ssm, x, self._dt(dt), A, B, C, D=self._D())
        out = self._gate_and_project(y.reshape(b, self.d_inner), z)
        return out, Mamba2State(conv, ssm)
