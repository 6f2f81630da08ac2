"""The SSD scan of Mamba2 in plain PyTorch (chunked, any sequence length).

The recurrence, per head h with a scalar decay, is

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T          (state: headdim x d_state)
    y_t = S_t C_t + D_h * x_t

The chunked ("state space duality") form computes it with matrix products: inside a chunk of Q
steps the map x -> y is a masked attention-like product (quadratic in Q), and only the states at
chunk boundaries are passed on sequentially (a small (chunks+1)^2 product). The sequence is padded
with dt = 0 steps, which neither decay nor feed the state, so any length gives the exact result
and the exact final state.

All decays are built from `segment_sum` (sums of log-decays over index ranges, never differences
of cumulative sums), so a document boundary can be expressed as a log-decay of -inf: it zeroes
every path through it without producing inf - inf.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from implicit_megatron.models.norms import compute_dtype


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, and -inf above the diagonal.

    exp(segment_sum(log_decay)) is the decay matrix from step j to step i of a chunk.
    """
    q = a.shape[-1]
    lower = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)
    x = a[..., :, None].expand(*a.shape, q)  # x[..., i, j] = a[..., i]
    x = x.masked_fill(~lower, 0).cumsum(-2)
    return x.masked_fill(~torch.ones_like(lower).tril(), float("-inf"))


def document_starts(seq_idx: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a new document begins (seq_idx changes), never at t = 0."""
    starts = torch.zeros_like(seq_idx, dtype=torch.bool)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    return starts


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run the scan over a whole sequence.

    x: (b, t, h, p) inputs; dt: (b, t, h) step sizes, already softplus'ed and clamped; A: (h,) negative
    decay rates; B, C: (b, t, g, n) with g groups shared by h/g consecutive heads; D: (h,) or (h, p);
    initial_state: (b, h, p, n); seq_idx: (b, t) non-decreasing document ids -- no state crosses a change.
    Returns y (b, t, h, p) in x's dtype, and the final state (b, h, p, n) in the compute precision.
    """
    b, t, h, p = x.shape
    g, n = B.shape[-2:]
    r = h // g  # heads per group
    q = chunk_size
    out_dtype = x.dtype
    cd = compute_dtype(x.dtype)
    x, dt, B, C = x.to(cd), dt.to(cd), B.to(cd), C.to(cd)

    log_decay = dt * A.to(cd)  # (b, t, h)
    if seq_idx is not None:
        log_decay = log_decay.masked_fill(document_starts(seq_idx)[..., None], float("-inf"))
    x_dt = x * dt[..., None]

    pad = (-t) % q
    if pad:
        x_dt = F.pad(x_dt, (0, 0, 0, 0, 0, pad))
        log_decay = F.pad(log_decay, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    c = (t + pad) // q

    # Chunked views. Letters: c chunk, l/s positions in a chunk (target/source), g group,
    # r head within the group, p head dim, n state dim.
    xc = x_dt.reshape(b, c, q, g, r, p)
    Bc = B.reshape(b, c, q, g, n)
    Cc = C.reshape(b, c, q, g, n)
    ac = log_decay.reshape(b, c, q, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, l)

    # 1. Within each chunk: y_l = sum_{s<=l} (C_l . B_s) decay(s -> l) x_s dt_s.
    decay = torch.exp(segment_sum(ac))  # (b, c, g, r, l, s)
    scores = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", decay * scores[:, :, :, None], xc)

    # 2. The state each chunk leaves behind, from its own inputs only.
    decay_to_end = decay[..., -1, :]  # (b, c, g, r, s): decay from s to the chunk's last step
    chunk_states = torch.einsum("bcsgn,bcsgrp->bcgrpn", Bc, xc * decay_to_end.permute(0, 1, 4, 2, 3)[..., None])

    # 3. Pass states across chunks: start[c] = sum_{k<c} decay(end of k -> end of c-1) chunk_states[k].
    if initial_state is None:
        first = torch.zeros_like(chunk_states[:, :1])
    else:
        first = initial_state.to(cd).reshape(b, 1, g, r, p, n)
    chunk_states = torch.cat([first, chunk_states], dim=1)  # (b, c+1, ...)
    totals = F.pad(ac.sum(-1), (0, 0, 0, 0, 1, 0))  # (b, c+1, g, r): log-decay over each chunk
    chunk_decay = torch.exp(segment_sum(totals.permute(0, 2, 3, 1)))  # (b, g, r, c+1, c+1)
    states = torch.einsum("bgrzk,bkgrpn->bzgrpn", chunk_decay, chunk_states)
    start_states, final_state = states[:, :-1], states[:, -1]

    # 4. Contribution of the state entering each chunk: C_l . start, decayed to step l.
    decay_from_start = torch.exp(torch.cumsum(ac, dim=-1))  # (b, c, g, r, l)
    y_prev = torch.einsum("bclgn,bcgrpn->bclgrp", Cc, start_states)
    y = y + y_prev * decay_from_start.permute(0, 1, 4, 2, 3)[..., None]

    y = y.reshape(b, c * q, h, p)[:, :t]
    if D is not None:
        D = D.to(cd)
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    y = y.to(out_dtype)
    if return_final_state:
        return y, final_state.reshape(b, h, p, n)
    return y


def ssd_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the recurrence, returning (y, new_state) without touching `state`.

    state: (b, h, p, n); x: (b, h, p); dt: (b, h) processed step sizes; B, C: (b, g, n).
    """
    b, h, p, n = state.shape
    g = B.shape[1]
    cd = state.dtype
    x_c, dt = x.to(cd), dt.to(cd)
    Bh = B.to(cd).repeat_interleave(h // g, dim=1)  # (b, h, n)
    Ch = C.to(cd).repeat_interleave(h // g, dim=1)
    decay = torch.exp(dt * A.to(cd))  # (b, h)
    new_state = state * decay[..., None, None] + (x_c * dt[..., None])[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", new_state, Ch)
    if D is not None:
        D = D.to(cd)
        y = y + x_c * (D[:, None] if D.dim() == 1 else D)
    return y.to(x.dtype), new_state
