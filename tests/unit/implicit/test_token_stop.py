"""The default evaluation stop (implicit.eval_stop=token): each position stops at its own residual,
so a position's result depends on the tokens up to it alone. A row gets what it gets alone whatever
shares its batch and whatever pads it, with no attention mask (lm-eval's hf model pads on the right
and passes none), and a prefix gets the same logits whatever follows it. The per-sequence and the
released batch-wide rules give neither, which is why neither is the default."""

from __future__ import annotations

import pytest
import torch
from support.tiny_exports import tiny_model

from implicit_megatron.implicit import SolverSettings

LENGTHS = (5, 17, 9, 30)


def rows() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 1000, (n,), generator=generator) for n in LENGTHS]


def right_padded(batch: list[torch.Tensor]) -> torch.Tensor:
    ids = torch.zeros(len(batch), max(LENGTHS), dtype=torch.long)  # token 0 after each row, no mask
    for i, row in enumerate(batch):
        ids[i, :len(row)] = row
    return ids


def model_for(arch: str, stop: str, rule: str):
    model, _ = tiny_model(f"{arch}-implicit", tol=0.05, scales=(0.5, 3.0, 3.0))
    model.core.set_phase(eval_stop=stop, eval_rule=rule)
    return model.double().eval()


def gap_to_alone(model) -> float:
    """The largest difference of a padded batch row's logits from the row run alone."""
    batch = rows()
    with torch.no_grad():
        logits = model(right_padded(batch))
        return max((logits[i, :len(row)] - model(row[None])[0]).abs().max().item() for i, row in enumerate(batch))


@pytest.mark.parametrize("rule", ["released", "solver"])
@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_each_row_gets_its_result_alone_through_unmasked_padding(arch, rule):
    assert SolverSettings().eval_stop == "token"
    model = model_for(arch, "token", rule)
    assert gap_to_alone(model) < 1e-10


@pytest.mark.parametrize("rule", ["released", "solver"])
@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_a_prefix_gets_the_same_logits_whatever_follows(arch, rule):
    model = model_for(arch, "token", rule)
    row = rows()[3]
    with torch.no_grad():
        whole, prefix = model(row[None])[0], model(row[None, :12])[0]
    assert (whole[:12] - prefix).abs().max().item() < 1e-10


@pytest.mark.parametrize("stop", ["sequence", "batch"])
def test_the_other_rules_let_padding_and_companions_move_a_row(stop):
    """Why token is the default: on this model the per-sequence rule moves a row by 0.03 through
    unmasked padding, the batch-wide rule by 0.04 (float32 figures; float64 here)."""
    assert gap_to_alone(model_for("mamba2", stop, "released")) > 1e-3


def test_with_a_mask_rows_count_their_own_passes():
    """Unmasked padding is iterated as tokens (it cannot be told apart), so a row's pass count may
    include it; with the mask it stops at once and each row counts the passes it takes alone."""
    model = model_for("mamba2", "token", "released")
    batch = rows()
    ids = right_padded(batch)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(batch):
        mask[i, :len(row)] = 1
    with torch.no_grad():
        model(ids, attention_mask=mask)
        in_batch = model.core.last_stats.passes_per_sample.tolist()
        alone = []
        for row in batch:
            model(row[None])
            alone.append(model.core.last_stats.passes)
    assert len(set(alone)) > 1 and in_batch == alone
