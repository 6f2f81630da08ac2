"""Exporting a trained checkpoint: the exported folder computes what the training model computed."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from support.processes import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from data_pipeline.tokenizer import load_tokenizer
from implicit_megatron import build_model, from_pretrained
from implicit_megatron.builder import remove_weight_norm
from implicit_megatron.hf.export import read_checkpoint


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/convert_checkpoint.py", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [0, 3])  # a plain module, and ZeRO shards through zero_to_fp32
def test_export_gives_the_training_models_logits_in_ours_and_in_transformers(stage, llama_run, zero3_run,
                                                                           tmp_path, caplog):
    """The shared runs with weight norm (tests/conftest.py), read only: the implicit Llama under ZeRO-0,
    the implicit Mamba2 under ZeRO-3."""
    run, out = llama_run if stage == 0 else zero3_run, tmp_path / "export"
    converted = convert("export", run / "checkpoints", out)
    assert converted.returncode == 0, converted.stderr[-3000:]

    # The training model: the checkpoint's module weights (fp32 training: the master weights), weight norm on.
    state, cfg = read_checkpoint(run / "checkpoints")
    trained = build_model(cfg).eval()
    if stage == 0:
        saved = torch.load(run / "checkpoints" / "free-step6" / "mp_rank_00_model_states.pt", weights_only=False)
        trained.load_state_dict(saved["module"], strict=True)
    else:
        trained.load_state_dict(state, strict=True)
    assert any("parametrizations" in name for name in state)
    free = cfg.curriculum.phases[-1]  # the solver of the phase the checkpoint ended, not the config's default
    assert (cfg.implicit.max_iter, cfg.implicit.tol, cfg.implicit.phantom_steps) == (free.max_iter, free.tol,
                                                                                      free.phantom_steps)

    exported = from_pretrained(out)
    assert exported.core.settings.max_iter == free.max_iter and exported.core.settings.tol == free.tol
    assert not any("parametrizations" in name for name in exported.state_dict())
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("im_")) == [
        "config.json", "model.safetensors", "modeling_implicit_megatron.py", "tokenizer.json", "tokenizer_config.json"]
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 1000, (2, 24))  # the tiny configs' vocabulary
    with torch.no_grad():
        expected, ours, theirs = trained(ids), exported(ids), hf(ids).logits
    for got in (ours, theirs):
        assert (got - expected).abs().max().item() < 1e-5 * expected.abs().max().item()
    assert hf(ids[:1], labels=ids[:1]).loss.item() > 0
    tokenizer = AutoTokenizer.from_pretrained(out)  # the run's tokenizer, as transformers reads it
    assert tokenizer("ROMEO: what?")["input_ids"] == load_tokenizer(cfg.data.tokenizer).encode("ROMEO: what?")
    assert tokenizer.eos_token == "<|endoftext|>"
    long_text = " ".join(["ROMEO: what?"] * (cfg.data.seq_len * 4))  # well past 4x the training length
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            assert len(tokenizer(long_text)["input_ids"]) > 4 * cfg.data.seq_len
    finally:
        transformers_logging.disable_propagation()
    assert not [r for r in caplog.records if "sequence length" in r.getMessage()], caplog.text

    if stage:  # DeepSpeed's own consolidation of the same checkpoint, weight norm folded the same way
        subprocess.run([sys.executable, str(run / "checkpoints" / "zero_to_fp32.py"), str(run / "checkpoints"),
                        str(tmp_path / "z2f"), "--safe_serialization"], check=True, capture_output=True)
        theirs_model = build_model(cfg)
        theirs_model.load_state_dict(load_file(str(tmp_path / "z2f" / "model.safetensors")), strict=True)
        remove_weight_norm(theirs_model)
        mine = load_file(str(out / "model.safetensors"))
        assert mine.keys() == theirs_model.state_dict().keys()
        for name, tensor in theirs_model.state_dict().items():
            assert torch.equal(mine[name], tensor), name


def test_clear_errors(tmp_path):
    bad = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "export", str(tmp_path), str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a checkpoint folder" in bad.stderr
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
