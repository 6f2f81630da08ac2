"""Loading either kind of folder, the solver phase it implies, and clear errors for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from implicit_megatron import load_config
from implicit_megatron.evaluation.loading import NotAModelError, classify, load_model
from implicit_megatron.evaluation.phases import SolverChoice, resolve_solver
from implicit_megatron.evaluation.windows import check_prefix

ROOT = Path(__file__).resolve().parents[3]


def test_checkpoint_folder_and_export_give_the_same_model(tiny_run):
    from_checkpoint = load_model(tiny_run.checkpoints)
    from_export = load_model(tiny_run.export)
    assert from_checkpoint.kind == "checkpoint" and from_checkpoint.tag == "free-step30"
    assert from_export.kind == "export"
    assert from_checkpoint.solver == from_export.solver  # the tag's phase; the export's last phase
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        assert torch.allclose(from_checkpoint.model(ids), from_export.model(ids), atol=1e-5)
    assert from_export.tokenizer.encode("ROMEO:") == from_checkpoint.tokenizer.encode("ROMEO:")
    assert classify(tiny_run.run_dir)[0] == "checkpoint"  # a run folder is read through its checkpoints/
    assert (Path(tiny_run.export) / "model.safetensors").stat().st_mode & 0o044 == 0o044  # others can read it


def test_a_checkpoint_saved_with_a_retired_key_still_loads(tmp_path):
    from implicit_megatron.config.saved import config_from_dict

    saved = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", check_files=False).to_dict()
    saved["train"]["eval_iters"] = 10  # written by earlier versions
    assert config_from_dict(saved, "old checkpoint").train.eval_samples == saved["train"]["eval_samples"]


def test_the_solver_follows_the_phase_and_the_overrides(tiny_run):
    cfg = load_model(tiny_run.export).cfg
    free = resolve_solver(cfg, None, SolverChoice())
    assert (free["phase"], free["label"], free["tol"], free["cap"]) == ("free", "(24+4)", 0.05, 96)
    bounded = resolve_solver(cfg, "bounded", SolverChoice())  # as the released (4+1) models: eps 0.05, 16 passes
    assert (bounded["label"], bounded["tol"], bounded["cap"]) == ("(4+1)", 0.05, 16)
    fixed = resolve_solver(cfg, "bounded", SolverChoice(fixed_depth=True))
    assert (fixed["tol"], fixed["cap"]) == (None, 4)
    assert resolve_solver(cfg, "bounded", SolverChoice(phase="free", max_iter=7, tol=0.01))["cap"] == 7
    with pytest.raises(ValueError, match="phase 'middle' is not in the run's curriculum"):
        resolve_solver(cfg, None, SolverChoice(phase="middle"))
    model = load_model(tiny_run.export, choice=SolverChoice(max_iter=7, tol=0.01)).model
    assert model.core.settings.cap(training=False) == 7 and model.core.settings.tol == 0.01
    fixed = load_model(tiny_run.export, choice=SolverChoice(phase="bounded", fixed_depth=True)).model
    assert fixed.core.settings.cap(training=False) == 4 and fixed.core.settings.stop_tol(training=False) is None


def test_a_path_that_is_no_model_is_refused_clearly(tmp_path):
    with pytest.raises(NotAModelError, match="no such file or directory"):
        classify(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotAModelError, match="neither a checkpoint folder .* nor an exported folder"):
        classify(tmp_path)


def test_a_missing_data_prefix_is_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_prefix(str(tmp_path / "nowhere" / "neox"))
    with pytest.raises(FileNotFoundError, match="no test shards for prefix"):
        check_prefix(str(tmp_path / "neox"))


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused_at_load(tmp_path):
    """An entry of the export's tokenizer.json mapped past 10^6 loaded, then ended in the embedding's
    IndexError when its token came up: the largest id is checked against model.vocab_size at load."""
    import json

    from support.tiny_exports import write_tiny_export

    export = write_tiny_export("mamba2-explicit", tmp_path)
    raw = json.loads((export / "tokenizer.json").read_text())
    vocab = raw["model"]["vocab"]
    vocab[next(token for token, i in vocab.items() if i == 300)] = 10**6
    (export / "tokenizer.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"^{export / 'tokenizer.json'}: token ids up to 1000000, past the model's "
                                         r"vocabulary of \d+ \(model.vocab_size\)"):
        load_model(export)


def test_an_export_whose_tokenizer_pads_every_prompt_is_refused_in_one_line(tmp_path, capsys):
    """A received export's tokenizer.json with a padding section padded every prompt of evaluation and
    generation to its length, with no word."""
    import json

    from support.tiny_exports import write_tiny_export
    from support.tools import load_tool

    export = write_tiny_export("llama-explicit", tmp_path)
    described = json.loads((export / "tokenizer.json").read_text())
    described["padding"] = {"strategy": {"Fixed": 48}, "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0,
                            "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (export / "tokenizer.json").write_text(json.dumps(described))
    assert load_tool("generate").main([str(export), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"generate: {export / 'tokenizer.json'}: its 'padding' section (length 48, pad_token "
                          "<|endoftext|>) would pad every text it encodes") and err.count("\n") == 1, err
