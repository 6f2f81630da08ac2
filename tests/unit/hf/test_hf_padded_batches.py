"""Padded batches through transformers: generate, a plain forward and pipeline, row by row equal to
each prompt alone (float64: tokens exactly, logits within 1e-5), on both sides of padding."""

from __future__ import annotations

import json

import pytest
import torch
from support.processes import ROOT
from support.tiny_exports import MODELS
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

PROMPTS = ["To be", "ROMEO: what light through yonder window", "HAMLET: to be, or"]  # 2, 17 and 9 tokens
NEW_TOKENS = 6


def load64(folder, side: str):
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side=side)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    return tokenizer, model


def greedy(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                         output_logits=True)
    return out.sequences[:, batch["input_ids"].shape[1]:], torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", MODELS)
def test_generate_gives_each_row_the_tokens_and_logits_of_its_prompt_alone(name, side, exports):
    tokenizer, model = load64(exports[name], side)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).sum() > 0 and tokenizer.pad_token_id == model.config.pad_token_id
    new, logits = greedy(model, batch)
    for row, prompt in enumerate(PROMPTS):
        alone_new, alone_logits = greedy(model, tokenizer(prompt, return_tensors="pt"))
        n = alone_new.shape[1]
        assert new[row, :n].tolist() == alone_new[0].tolist()
        assert (logits[row, :n] - alone_logits[0]).abs().max() < 1e-5


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", MODELS)
def test_a_padded_forward_gives_each_row_the_logits_of_its_prompt_alone(name, side, exports):
    tokenizer, model = load64(exports[name], side)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
        for row, prompt in enumerate(PROMPTS):
            alone = model(**tokenizer(prompt, return_tensors="pt")).logits[0]
            real = batch["attention_mask"][row].bool()
            assert (logits[row, real] - alone).abs().max() < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_pipeline_batches_padded_prompts(name, exports):
    tokenizer, model = load64(exports[name], "left")
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    options = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "return_full_text": False}
    batched = generator(PROMPTS, batch_size=3, **options)
    alone = [generator(prompt, **options) for prompt in PROMPTS]
    assert [b[0]["generated_text"] for b in batched] == [a[0]["generated_text"] for a in alone]


def test_the_export_config_has_the_usual_fields_and_no_absolute_paths(exports):
    for name in MODELS:
        text = (exports[name] / "config.json").read_text()
        config = json.loads(text)
        run = config["implicit_megatron"]
        assert config["hidden_size"] == run["model"]["d_model"] == 32
        assert config["num_hidden_layers"] == run["model"]["n_layers"]
        assert config["vocab_size"] >= run["model"]["vocab_size"]
        assert config["max_position_embeddings"] == run["data"]["seq_len"]
        assert config["torch_dtype"] == "float32"
        assert str(ROOT) not in text and str(exports[name].parent) not in text
        assert run["data"]["tokenizer"] == "data/tokenizers/shakespeare-bpe-1000.json.xz"  # relative, as it was run
        settings = json.loads((exports[name] / "tokenizer_config.json").read_text())
        assert settings["pad_token"] == settings["eos_token"]
    assert json.loads((exports["llama-explicit"] / "config.json").read_text())["num_attention_heads"] == 2
