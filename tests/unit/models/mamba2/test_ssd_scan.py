"""The chunked SSD scan against the plain recurrence it factorises."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from implicit_megatron.models.mamba2.ssd import segment_sum, ssd_scan, ssd_step


def recurrence(x, dt, A, B, C, D=None, state=None):
    """S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T ;  y_t = S_t C_t + D x_t, one step at a time."""
    b, t, h, p = x.shape
    g, n = B.shape[-2:]
    Bh = B.repeat_interleave(h // g, dim=2)
    Ch = C.repeat_interleave(h // g, dim=2)
    S = torch.zeros(b, h, p, n) if state is None else state.clone()
    ys = []
    for i in range(t):
        S = torch.exp(dt[:, i] * A)[..., None, None] * S + (dt[:, i, :, None] * x[:, i])[..., None] * Bh[:, i, :, None]
        y = (S * Ch[:, i, :, None]).sum(-1)
        if D is not None:
            y = y + D[:, None] * x[:, i]
        ys.append(y)
    return torch.stack(ys, 1), S


def inputs(b=2, t=37, h=4, p=3, g=2, n=5):
    x = torch.randn(b, t, h, p)
    dt = torch.rand(b, t, h) * 0.5 + 0.05
    A = -torch.rand(h) * 2 - 0.1
    B, C = torch.randn(b, t, g, n), torch.randn(b, t, g, n)
    D = torch.randn(h)
    return x, dt, A, B, C, D


def test_segment_sum_is_range_sums():
    a = torch.randn(6)
    s = segment_sum(a)
    for i in range(6):
        for j in range(6):
            expected = a[j + 1:i + 1].sum() if j <= i else float("-inf")
            assert s[i, j].item() == pytest.approx(float(expected), abs=1e-12)


@pytest.mark.parametrize("t", [1, 5, 16, 37, 64])
@pytest.mark.parametrize("groups", [1, 2])
def test_scan_equals_recurrence_for_any_length(t, groups, rel_err):
    x, dt, A, B, C, D = inputs(t=t, g=groups)
    y_ref, s_ref = recurrence(x, dt, A, B, C, D)
    y, s = ssd_scan(x, dt, A, B, C, chunk_size=16, D=D, return_final_state=True)
    assert rel_err(y, y_ref) < 1e-12
    assert rel_err(s, s_ref) < 1e-12


def test_scan_continues_from_an_initial_state(rel_err):
    x, dt, A, B, C, D = inputs(t=40)
    _, s_half = recurrence(x[:, :23], dt[:, :23], A, B[:, :23], C[:, :23])
    y_ref, s_ref = recurrence(x, dt, A, B, C, D)
    y2, s2 = ssd_scan(x[:, 23:], dt[:, 23:], A, B[:, 23:], C[:, 23:], chunk_size=8, D=D,
                      initial_state=s_half, return_final_state=True)
    assert rel_err(y2, y_ref[:, 23:]) < 1e-12
    assert rel_err(s2, s_ref) < 1e-12


def test_step_equals_recurrence_and_keeps_its_input_state(rel_err):
    x, dt, A, B, C, D = inputs(t=6)
    y_ref, _ = recurrence(x, dt, A, B, C, D)
    state = torch.zeros(2, 4, 3, 5)
    for i in range(6):
        before = state.clone()
        y, new = ssd_step(state, x[:, i], dt[:, i], A, B[:, i], C[:, i], D)
        assert torch.equal(state, before)
        assert rel_err(y, y_ref[:, i]) < 1e-12
        state = new


def test_seq_idx_resets_state_at_document_boundaries(rel_err):
    x, dt, A, B, C, D = inputs(t=45)
    cuts = [0, 7, 30, 45]  # boundaries inside chunks and a document spanning several chunks
    seq_idx = torch.cat([torch.full((b - a,), i, dtype=torch.int32) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    seq_idx = seq_idx.expand(2, -1)
    y = ssd_scan(x, dt, A, B, C, chunk_size=8, D=D, seq_idx=seq_idx)
    for a, b in zip(cuts, cuts[1:]):
        y_doc, _ = recurrence(x[:, a:b], dt[:, a:b], A, B[:, a:b], C[:, a:b], D)
        assert rel_err(y[:, a:b], y_doc) < 1e-12


def test_seq_idx_gradients_are_finite_and_do_not_cross_documents():
    x, dt, A, B, C, D = inputs(t=20)
    x.requires_grad_(True)
    seq_idx = torch.tensor([0] * 9 + [1] * 11, dtype=torch.int32).expand(2, -1)
    y = ssd_scan(x, dt, A, B, C, chunk_size=8, D=D, seq_idx=seq_idx)
    y[:, 9:].sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad[:, :9].abs().max() == 0


class LargestTensor(TorchDispatchMode):
    """The most elements any tensor made inside the context has."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def test_a_scan_shorter_than_its_chunk_does_the_work_of_its_own_length(rel_err):
    """A 48-step scan at chunk 256 runs one chunk of 48: no (256, 256) decay matrix is made."""
    x, dt, A, B, C, D = inputs(b=1, t=48, h=2, p=2, g=1, n=2)
    with LargestTensor() as largest:
        y = ssd_scan(x, dt, A, B, C, chunk_size=256, D=D)
    assert largest.numel == 2 * 48 * 48  # heads x the (48, 48) decay of its one chunk
    assert rel_err(y, recurrence(x, dt, A, B, C, D)[0]) < 1e-12


@pytest.mark.parametrize("chunk", [16, 256])
def test_one_chunk_and_many_give_the_state_of_the_recurrence(chunk, rel_err):
    """Whether the states between chunks are computed (many chunks, an initial state, the final state
    asked for) or skipped (one chunk from zero), y is the recurrence's."""
    x, dt, A, B, C, D = inputs(t=48)
    y_ref, s_ref = recurrence(x, dt, A, B, C, D)
    y_plain = ssd_scan(x, dt, A, B, C, chunk_size=chunk, D=D)
    y, s = ssd_scan(x, dt, A, B, C, chunk_size=chunk, D=D, return_final_state=True,
                    initial_state=torch.zeros(2, 4, 3, 5))
    assert rel_err(y_plain, y_ref) < 1e-12 and rel_err(y, y_ref) < 1e-12 and rel_err(s, s_ref) < 1e-12


def test_float32_keeps_the_recurrence_within_its_precision_at_strong_decays(rel_err):
    """Decays from step differences of the chunk's cumulative log-decay (as mamba_ssm's kernels): in
    float32 they stay within 2e-5 of the float64 recurrence even where the log-decay over the chunk
    reaches -2000 (dt 1, |A| up to 16 on every step of 128)."""
    x, _, _, B, C, D = inputs(t=128)
    dt, A = torch.rand(2, 128, 4), -torch.rand(4) * 16
    y_ref, _ = recurrence(x, dt, A, B, C, D)
    y = ssd_scan(*(v.float() for v in (x, dt, A, B, C)), chunk_size=128, D=D.float())
    assert y.dtype == torch.float32
    assert rel_err(y.double(), y_ref) < 2e-5


def test_documents_that_begin_at_and_across_chunk_borders_keep_no_state_of_the_one_before(rel_err):
    x, dt, A, B, C, D = inputs(t=40)
    cuts = [0, 8, 9, 24, 40]  # a document of one step, one that begins a chunk, one across two chunks
    seq_idx = torch.cat([torch.full((b - a,), i, dtype=torch.int32) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    y, s = ssd_scan(x, dt, A, B, C, chunk_size=8, D=D, seq_idx=seq_idx.expand(2, -1), return_final_state=True)
    for a, b in zip(cuts, cuts[1:]):
        y_doc, s_doc = recurrence(x[:, a:b], dt[:, a:b], A, B[:, a:b], C[:, a:b], D)
        assert rel_err(y[:, a:b], y_doc) < 1e-12
    assert rel_err(s, s_doc) < 1e-12  # the final state is the last document's alone
