"""Padded batches: each row is computed, and stops, as its prompt alone (both modes, both rules)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from implicit_megatron import build_model, load_config
from implicit_megatron.config import ImplicitConfig
from implicit_megatron.implicit import SolverSettings

ROOT = Path(__file__).resolve().parents[3]

LENGTHS = (3, 9, 6)


def prompts(seed: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 101, (n,), generator=generator) for n in LENGTHS]


def padded(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of the rows padded with token 0 on `side`."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, span], mask[i, span] = r, 1
    return ids, mask


def real_span(mask_row: torch.Tensor) -> torch.Tensor:
    return mask_row.nonzero().flatten()


def loose(model, rule: str) -> None:
    """A tolerance that the rows reach after different numbers of passes."""
    model.core.settings = SolverSettings(max_iter=40, tol=1e-4, eval_factor=1, eval_rule=rule, eval_stop="sequence")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("rule", ["released", "solver"])
def test_sequential_rows_equal_each_prompt_alone(arch, side, rule, make_model):
    model = make_model(arch, seed=1, contractive=True).eval()
    loose(model, rule)
    rows = prompts()
    ids, mask = padded(rows, side)
    z, _, stats = model.core.forward_sequential(model.embedding(ids), mask=mask)
    row_passes = torch.stack([s.passes_per_sample for s in stats], dim=1)  # (B, T)
    for i, row in enumerate(rows):
        alone, _, alone_stats = model.core.forward_sequential(model.embedding(row[None]))
        at = real_span(mask[i])
        assert (z[i, at] - alone[0]).abs().max() < 1e-10
        assert row_passes[i, at].tolist() == [s.passes for s in alone_stats]  # its own passes, in any batch
        assert (row_passes[i][mask[i] == 0] == 0).all()  # padding is not iterated
    # the rows need different passes: a batch-wide stop would change them (and their z)
    assert len({tuple(row_passes[i, real_span(mask[i])][:3].tolist()) for i in range(3)}) > 1


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("rule", ["released", "solver"])
def test_simultaneous_rows_equal_each_prompt_alone(arch, side, rule, make_model):
    model = make_model(arch, seed=1, contractive=True).eval()
    loose(model, rule)
    rows = prompts()
    ids, mask = padded(rows, side)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
        batch_passes = model.core.last_stats.passes_per_sample
        for i, row in enumerate(rows):
            alone = model(row[None])
            assert batch_passes[i] == model.core.last_stats.passes
            assert (logits[i, real_span(mask[i])] - alone[0]).abs().max() < 1e-5
    assert len(set(batch_passes.tolist())) > 1


def test_the_batch_wide_rule_runs_only_when_named_and_shares_its_passes(make_model):
    assert SolverSettings().eval_stop == ImplicitConfig().eval_stop == "token"
    model = make_model("mamba2", seed=1, contractive=True).eval()
    model.core.settings = SolverSettings(max_iter=40, tol=1e-4, eval_factor=1, eval_rule="solver", eval_stop="batch")
    ids, mask = padded(prompts(), "left")
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert model.core.last_stats.row_passes is None
    assert (model.core.last_stats.passes_per_sample == model.core.last_stats.passes).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_explicit_rows_equal_each_prompt_alone(arch, side):
    cfg = load_config(ROOT / f"configs/tiny/{arch}-explicit.yaml", ["model.vocab_size=101"], check_files=False)
    torch.manual_seed(2)
    model = build_model(cfg).double().eval()
    rows = prompts()
    ids, mask = padded(rows, side)
    z, _, _ = model.core.forward_sequential(model.embedding(ids), mask=mask)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
        for i, row in enumerate(rows):
            at = real_span(mask[i])
            assert (logits[i, at] - model(row[None])[0]).abs().max() < 1e-10
            alone, _, _ = model.core.forward_sequential(model.embedding(row[None]))
            assert (z[i, at] - alone[0]).abs().max() < 1e-10


def test_padding_repeats_the_rows_last_real_output(make_model):
    """Right padding ends a row with its last real token's logits (what generate reads)."""
    model = make_model("llama", seed=1, contractive=True).eval()
    loose(model, "released")
    ids, mask = padded(prompts(), "right")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
    z, _, _ = model.core.forward_sequential(model.embedding(ids), mask=mask)
    for i, n in enumerate(LENGTHS):
        if n == max(LENGTHS):
            continue
        assert (logits[i, n:] - logits[i, n - 1]).abs().max() < 1e-12
        assert torch.equal(z[i, n:], z[i, n - 1].expand_as(z[i, n:]))


def test_a_padded_token_leaves_the_state_as_it_was(arch, make_model):
    """Padding in the middle of a row (a prompt continued after a right-padded batch) changes nothing."""
    model = make_model(arch, seed=1, contractive=True).eval()
    loose(model, "solver")
    row = prompts()[1]
    ids = torch.cat([row[:4], torch.zeros(3, dtype=torch.long), row[4:]])[None]
    mask = torch.tensor([[1] * 4 + [0] * 3 + [1] * (len(row) - 4)])
    z, _, _ = model.core.forward_sequential(model.embedding(ids), mask=mask)
    alone, _, _ = model.core.forward_sequential(model.embedding(row[None]))
    assert (z[0, mask[0].bool()] - alone[0]).abs().max() < 1e-10


def test_warm_start_begins_each_token_at_the_previous_fixed_point(arch, make_model):
    """One pass per token: cold gives F(0), warm gives F(z*_{t-1}), each under the committed state."""
    model = make_model(arch, seed=1, contractive=True).eval()
    x = model.embedding(torch.randint(1, 101, (2, 5)))
    model.core.settings = SolverSettings(max_iter=1, tol=None, eval_factor=1, eval_tol=None, eval_rule="solver",
                                         warm_start=True)
    warm, _, _ = model.core.forward_sequential(x)
    state = model.core.backbone.allocate_state(2, 5, dtype=x.dtype)
    inj = model.core.injection(x)
    previous = torch.zeros_like(x[:, 0])
    for t in range(5):
        expected, state = model.core.backbone.step(previous, state, inj[:, t])
        assert torch.equal(warm[:, t], expected)
        previous = expected


@pytest.mark.parametrize("rule", ["released", "solver"])
def test_the_released_codes_batch_wide_sequential_rule_is_kept(rule, make_model):
    """sequential_stop=batch: one stop test per token over the real rows, as the released code runs a batch."""
    model = make_model("mamba2", seed=1, contractive=True).eval()
    loose(model, rule)
    model.core.set_phase(sequential_stop="batch")
    ids, mask = padded(prompts(), "left")
    _, _, stats = model.core.forward_sequential(model.embedding(ids), mask=mask)
    for token in stats:
        passes = token.passes_per_sample[token.passes_per_sample > 0]
        assert (passes == passes.max()).all()
    assert len({token.passes for token in stats}) > 1
