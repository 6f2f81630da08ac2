"""The SSD scan of Mamba2 in plain PyTorch (chunked, any sequence length).

The recurrence, per head h with a scalar decay, is

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T          (state: headdim x d_state)
    y_t = S_t C_t + D_h * x_t

The chunked ("state space duality") form computes it with matrix products: inside a chunk of Q
steps the map x -> y is a masked attention-like product (quadratic in Q), and only the states at
chunk boundaries are passed on sequentially (a small (chunks+1)^2 product). The sequence is padded
with dt = 0 steps, which neither decay nor feed the state, so any length gives the exact result
and the exact final state.

Only the work a call needs is done: the chunk is the smaller of `chunk_size` and the sequence's
length (a 48-token pass at chunk 256 is not the work of 256 positions), and a call that is one
chunk from a zero state, whose final state nobody asked for, skips the states between chunks.

Inside a chunk the decay from step s to step l is exp(cs_l - cs_s), cs the chunk's cumulative
log-decay, as mamba_ssm's kernels compute it: one subtraction per pair instead of a masked
cumulative sum over the (Q, Q) matrix. A document boundary (seq_idx) cuts every path through it by
a mask of the pairs of one document (never a log-decay of -inf, which would give inf - inf); between
chunks a chunk holding a boundary passes on nothing (`segment_sum` with -inf, on the small matrix).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from implicit_megatron.models.documents import document_starts
from implicit_megatron.models.norms import as_dtype, compute_dtype


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, and -inf above the diagonal.

    exp(segment_sum(log_decay)) is the decay matrix from step j to step i; a -inf in `a` zeroes
    every path through it without producing inf - inf. Used between chunks, where the matrix is small.
    """
    q = a.shape[-1]
    lower = _lower(q, a.device, strict=True)
    x = a[..., :, None].expand(*a.shape, q)  # x[..., i, j] = a[..., i]
    x = x.masked_fill(~lower, 0).cumsum(-2)
    return x.masked_fill(~_lower(q, a.device), float("-inf"))


@functools.lru_cache(maxsize=64)
def _lower(q: int, device: torch.device, strict: bool = False) -> torch.Tensor:
    """The (q, q) lower-triangular mask (with the diagonal unless `strict`), made once per size and device."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def chunk_length(t: int, chunk_size: int) -> int:
    """The chunk a scan of `t` steps uses: chunk_size, or the whole sequence where it is shorter."""
    return max(1, min(chunk_size, t))


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
    q = chunk_length(t, chunk_size)
    pad = (-t) % q
    c = (t + pad) // q
    out_dtype, cd = x.dtype, compute_dtype(x.dtype)
    x, dt, A, B, C = (as_dtype(v, cd) for v in (x, dt, A, B, C))

    log_decay = dt * A  # (b, t, h)
    x_dt = x * dt[..., None]
    if pad:
        x_dt = F.pad(x_dt, (0, 0, 0, 0, 0, pad))
        log_decay = F.pad(log_decay, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))

    # Chunked views. Letters: c chunk, l/s positions in a chunk (target/source), g group,
    # r head within the group, p head dim, n state dim.
    xc = x_dt.reshape(b, c, q, g, r, p)
    Bc = B.reshape(b, c, q, g, n)
    Cc = C.reshape(b, c, q, g, n)
    cs = log_decay.reshape(b, c, q, g, r).permute(0, 1, 3, 4, 2).cumsum(-1)  # (b, c, g, r, l)
    one_doc = _one_document(seq_idx, pad, b, c, q)  # (b, c, 1, l, s) or None

    # 1. Within each chunk: y_l = sum_{s<=l} (C_l . B_s) decay(s -> l) x_s dt_s.
    # The pairs s > l (and those of two documents) are masked in the scores, which have no head
    # axis: the decay is only clamped there (exp(cs_l - cs_s) would overflow for s > l).
    decay = torch.exp((cs[..., :, None] - cs[..., None, :]).clamp_max(0))  # (b, c, g, r, l, s)
    keep = _lower(q, x.device) if one_doc is None else one_doc & _lower(q, x.device)
    scores = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc).masked_fill(~keep, 0)
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", decay * scores[:, :, :, None], xc)

    if c > 1 or initial_state is not None or return_final_state:
        to_end = decay[..., -1, :] if one_doc is None else decay[..., -1, :] * one_doc[:, :, :, None, -1]
        y, final_state = _across_chunks(y, xc, Bc, Cc, cs, to_end, seq_idx, pad, initial_state)

    y = y.reshape(b, c * q, h, p)[:, :t]
    if D is not None:
        D = as_dtype(D, cd)
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    y = as_dtype(y, out_dtype)
    if return_final_state:
        return y, final_state.reshape(b, h, p, n)
    return y


def _one_document(seq_idx: torch.Tensor | None, pad: int, b: int, c: int, q: int) -> torch.Tensor | None:
    """(b, c, 1, l, s) bool: steps l and s of a chunk are of one document (None: no seq_idx)."""
    if seq_idx is None:
        return None
    ids = F.pad(seq_idx, (0, pad), value=-1).reshape(b, c, q)  # padding is a document of its own
    return (ids[..., :, None] == ids[..., None, :])[:, :, None]


def _across_chunks(y, xc, Bc, Cc, cs, decay_to_end, seq_idx, pad, initial_state):
    """Add to y what the state entering each chunk contributes, and return the final state.
    decay_to_end (b, c, g, r, s): the decay from step s to the chunk's last step (0 across documents)."""
    b, c, q = xc.shape[:3]
    g, r, p, n = xc.shape[3], xc.shape[4], xc.shape[5], Bc.shape[-1]
    # 2. The state each chunk leaves behind, from its own inputs only.
    chunk_states = torch.einsum("bcsgn,bcsgrp->bcgrpn", Bc, xc * decay_to_end.permute(0, 1, 4, 2, 3)[..., None])

    # 3. Pass states across chunks: start[c] = sum_{k<c} decay(end of k -> end of c-1) chunk_states[k].
    if initial_state is None:
        first = torch.zeros_like(chunk_states[:, :1])
    else:
        first = initial_state.to(chunk_states.dtype).reshape(b, 1, g, r, p, n)
    chunk_states = torch.cat([first, chunk_states], dim=1)  # (b, c+1, ...)
    totals, from_start = cs[..., -1], torch.exp(cs)  # (b, c, g, r), (b, c, g, r, l)
    if seq_idx is not None:  # a chunk holding a boundary passes nothing on, nor lets the start state in
        starts = F.pad(document_starts(seq_idx), (0, pad)).reshape(b, c, 1, 1, q)
        totals = totals.masked_fill(starts.any(-1), float("-inf"))
        from_start = from_start.masked_fill(starts.cumsum(-1) > 0, 0)
    totals = F.pad(totals, (0, 0, 0, 0, 1, 0))  # (b, c+1, g, r): log-decay over each chunk
    chunk_decay = torch.exp(segment_sum(totals.permute(0, 2, 3, 1)))  # (b, g, r, c+1, c+1)
    states = torch.einsum("bgrzk,bkgrpn->bzgrpn", chunk_decay, chunk_states)
    start_states, final_state = states[:, :-1], states[:, -1]

    # 4. Contribution of the state entering each chunk: C_l . start, decayed to step l.
    y_prev = torch.einsum("bclgn,bcgrpn->bclgrp", Cc, start_states)
    return y + y_prev * from_start.permute(0, 1, 4, 2, 3)[..., None], final_state


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
