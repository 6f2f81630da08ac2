"""Importing explicit transformers Mamba2 and Llama models: our model gives their logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.word_tokenizer import write_word_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM

from implicit_megatron import from_pretrained
from implicit_megatron.hf.import_explicit import import_explicit

ROOT = Path(__file__).resolve().parents[3]


def random_reference(arch: str):
    torch.manual_seed(0)
    if arch == "mamba2":
        model = Mamba2ForCausalLM(Mamba2Config(
            vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2, head_dim=16, num_heads=8,
            n_groups=2, conv_kernel=4, chunk_size=16, tie_word_embeddings=True))
    else:
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, attn_implementation="sdpa"))
    with torch.no_grad():
        for p in model.parameters():  # random weights, not the init: every tensor must arrive
            p.normal_(0.0, 0.1)
    return model.eval()


def save_with_tokenizer(model, folder: Path) -> None:
    """The folder as transformers' save_pretrained and a tokenizer's save_pretrained leave it."""
    model.save_pretrained(folder)
    write_word_tokenizer(folder / "tokenizer.json", 128)


@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_imported_model_gives_the_reference_logits(arch, tmp_path):
    ref = random_reference(arch)
    save_with_tokenizer(ref, tmp_path / "src")
    import_explicit(tmp_path / "src", tmp_path / "ours")
    ours = from_pretrained(tmp_path / "ours")
    ids = torch.randint(0, 128, (2, 21))
    with torch.no_grad():
        expected, got = ref(ids).logits, ours(ids)
    assert (got - expected).abs().max().item() < 1e-5 * expected.abs().max().item()


def test_import_into_an_implicit_config_keeps_a_fresh_injection(tmp_path):
    ref = random_reference("mamba2")
    save_with_tokenizer(ref, tmp_path / "src")
    import_explicit(tmp_path / "src", tmp_path / "ours", ROOT / "configs/tiny/mamba2-implicit.yaml")
    ours = from_pretrained(tmp_path / "ours")
    assert ours.core.implicit and ours.core.injection is not None
    embedding = ref.backbone.embeddings.weight
    assert torch.equal(ours.embedding.weight, embedding)
    # every tensor but the injection's is the source's (the explicit import gives the source's logits)
    import_explicit(tmp_path / "src", tmp_path / "explicit")
    explicit = from_pretrained(tmp_path / "explicit").state_dict()
    implicit = ours.state_dict()
    assert set(implicit) - set(explicit) == {k for k in implicit if k.startswith("core.injection.")}
    assert all(torch.equal(implicit[k], explicit[k]) for k in explicit)
    # the injection as build_model initialises it: a Linear at init scale after a unit RMSNorm
    injection = ours.core.injection
    assert torch.equal(injection.norm.weight, torch.ones_like(injection.norm.weight))
    assert 0.5 * 0.02 < injection.proj.weight.std().item() < 2 * 0.02, injection.proj.weight.std()


def test_shape_mismatch_names_the_tensor(tmp_path):
    ref = random_reference("llama")
    save_with_tokenizer(ref, tmp_path / "src")
    config = (tmp_path / "src" / "config.json")
    config.write_text(config.read_text().replace('"intermediate_size": 96', '"intermediate_size": 128'))
    with pytest.raises(ValueError, match=r"tensor 'core\.backbone\.layers\.0\.mlp\.\w+_proj\.weight' has shape"):
        import_explicit(tmp_path / "src", tmp_path / "ours")
