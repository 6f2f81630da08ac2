"""An import publishes the model's own tokenizer: derived from the source where it says which, else
named by the user; never a default that does not fit (a 50,277-id tokenizer beside a 128-row model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.tools import load_tool
from support.word_tokenizer import write_word_tokenizer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from implicit_megatron.config import read_config
from implicit_megatron.hf.import_explicit import DEFAULT_BASE
from implicit_megatron.hf.import_tokenizer import SHIPPED, matching_tokenizer

ROOT = Path(__file__).resolve().parents[3]
NEOX = ROOT / "data/tokenizers/gpt-neox-20b.json.xz"


def llama_folder(folder: Path, vocab: int = 128) -> Path:
    """A transformers Llama as save_pretrained leaves it, without a tokenizer."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, tie_word_embeddings=True)).save_pretrained(folder)
    return folder


def convert(*args) -> int:
    return load_tool("convert_checkpoint").main([str(a) for a in args])


def test_a_source_naming_no_tokenizer_is_refused_naming_the_option(tmp_path, capsys):
    src = llama_folder(tmp_path / "src")
    capsys.readouterr()  # transformers' progress bar
    assert convert("import", src, tmp_path / "out") == 2
    assert capsys.readouterr().err == (
        f"convert_checkpoint: {src}: holds no tokenizer.json or tokenizer.model and its config.json names no "
        "tokenizer: name the tokenizer the model was trained with (--tokenizer FILE; the paper's models: "
        "--tokenizer data/tokenizers/gpt-neox-20b.json.xz)\n")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused_naming_both(tmp_path, capsys):
    src = llama_folder(tmp_path / "src")
    capsys.readouterr()  # transformers' progress bar
    assert convert("import", src, tmp_path / "out", "--tokenizer", NEOX) == 2
    assert capsys.readouterr().err == (
        f"convert_checkpoint: {NEOX} (--tokenizer) has token ids up to 50,276, past the vocabulary of the model in "
        f"{src} (128 tokens): not its tokenizer; name the one it was trained with (--tokenizer FILE)\n")
    base = tmp_path / "base.yaml"  # a base config's tokenizer must fit as well
    base.write_text(f"base: {ROOT / 'configs/tiny/llama-implicit.yaml'}\ndata: {{tokenizer: {NEOX}}}\n")
    assert convert("import", src, tmp_path / "out", "--base-config", base) == 2
    assert f"{NEOX} (data.tokenizer of {base}) has token ids up to 50,276" in capsys.readouterr().err
    released = ROOT / "tests/fixtures/released/llama"  # 64 rows; its config.json names GPT-NeoX-20B
    assert convert("import", released, tmp_path / "out") == 2
    assert f"{NEOX} (EleutherAI/gpt-neox-20b, which {released / 'config.json'} names) has token ids up to " \
           "50,276, past the vocabulary of the model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_source_folders_own_tokenizer_is_published_with_the_model(tmp_path, capsys):
    src = llama_folder(tmp_path / "src")
    capsys.readouterr()  # transformers' progress bar
    write_word_tokenizer(src / "tokenizer.json", 100)  # fewer ids than rows: a padded vocabulary
    assert convert("import", src, tmp_path / "out") == 0
    assert "(tokenizer copied from .../src/tokenizer.json)" in capsys.readouterr().out  # the last two parts
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert len(tokenizer) == 100 and tokenizer.decode(tokenizer("w5 w99")["input_ids"]) == "w5 w99"
    carried = json.loads((tmp_path / "out" / "config.json").read_text())["implicit_megatron"]["data"]["tokenizer"]
    assert carried.endswith("src/tokenizer.json")


def test_a_tokenizer_the_source_names_is_taken_where_it_fits():
    """The released 130M models name EleutherAI/gpt-neox-20b and have 50,277 (padded: 50,280) rows."""
    cfg = read_config(DEFAULT_BASE, ["model.vocab_size=50277"])
    chosen = matching_tokenizer(Path("released"), {"tokenizer": "EleutherAI/gpt-neox-20b"}, cfg, None, None)
    assert chosen == SHIPPED["EleutherAI/gpt-neox-20b"] == NEOX and cfg.data.tokenizer == str(NEOX)
    with pytest.raises(ValueError, match="names 'my-org/tok', which this repository does not ship"):
        matching_tokenizer(Path("received"), {"tokenizer": "my-org/tok"}, cfg, None, None)
