"""Sequential-mode generation against the simultaneous forward, and the samplers."""

from __future__ import annotations

import torch

from implicit_megatron.evaluation.generation import SamplingConfig, filter_logits, generate, sample_next


def test_greedy_generation_is_the_argmax_of_the_simultaneous_forward(loaded):
    model, tok = loaded.model, loaded.tokenizer
    prompt = tok.encode("ROMEO: But, soft! what light")
    result = generate(model, prompt, SamplingConfig(max_new_tokens=12, temperature=0.0, stop_at_eod=False))
    assert len(result.new_ids) == 12 and all(p >= 1 for p in result.passes)
    sequence = torch.tensor([prompt + result.new_ids[:-1]])
    with torch.no_grad():
        logits = model(sequence)[0, len(prompt) - 1:, :model.vocab_size]
    assert logits.argmax(-1).tolist() == result.new_ids


def test_generation_carries_only_the_committed_state(loaded):
    """The prompt run in one go, or in two calls through the state, gives the same continuation."""
    model, tok = loaded.model, loaded.tokenizer
    ids = tok.encode("HAMLET: To be, or not to be")
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0, stop_at_eod=False)
    assert generate(model, ids, greedy).new_ids == generate(model, ids, greedy).new_ids
    x = model.embedding(torch.tensor([ids]))
    whole, _, _ = model.core.forward_sequential(x)
    first, state, _ = model.core.forward_sequential(x[:, :3], None, max_len=len(ids))
    rest, _, _ = model.core.forward_sequential(x[:, 3:], state)
    assert torch.allclose(torch.cat([first, rest], dim=1), whole, atol=1e-6)


def test_sampling_is_seeded_and_stays_in_the_real_vocabulary(loaded):
    model = loaded.model
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, seed=3, stop_at_eod=False)
    first = generate(model, [10, 11], sampling).new_ids
    assert first == generate(model, [10, 11], sampling).new_ids
    logits = torch.zeros(1, model.padded_vocab_size)
    logits[0, model.vocab_size:] = 100.0  # padding rows never win
    assert int(sample_next(logits, model.vocab_size, SamplingConfig(temperature=0.0), None)) < model.vocab_size


def test_top_k_and_top_p_keep_the_most_likely_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(filter_logits(logits, 2, None)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.5)).tolist() == [[True, False, False, False]]
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isfinite(filter_logits(shuffled, None, 0.7)).tolist() == [[False, True, False, True]]
