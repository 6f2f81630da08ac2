"""Weights files received from others, read by the tools users run: a crafted safetensors header,
offsets past the end, and a pickled `pytorch_model.bin` end in one line naming the file (and the
pickle's code never runs), not in the reader's traceback."""

from __future__ import annotations

import json
import pathlib
import re
import struct

import pytest
import torch
from support.tiny_exports import write_tiny_export
from support.tools import load_tool
from transformers import LlamaConfig


def header_too_large(path: pathlib.Path) -> None:
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")


def offsets_past_the_end(path: pathlib.Path) -> None:
    header = json.dumps({"lm_head.weight": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))


class Marker:
    """Unpickled, it would create the marker file: the payload of a pickled weights file."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (self.path,)


@pytest.mark.parametrize(("damage", "why"), [(header_too_large, "header too large"),
                                             (offsets_past_the_end, "incomplete metadata, file not fully covered")])
def test_an_export_with_a_damaged_weights_file_is_one_line_naming_it(damage, why, tmp_path, capsys):
    export = write_tiny_export("mamba2-explicit", tmp_path)
    damage(export / "model.safetensors")
    assert load_tool("generate").main([str(export), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err == (f"generate: {export / 'model.safetensors'}: not a whole safetensors file "
                                       f"(SafetensorError: Error while deserializing header: {why})\n")


def explicit_folder(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    config = LlamaConfig(vocab_size=50277, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, tie_word_embeddings=True)
    (folder / "config.json").write_text(config.to_json_string())
    return folder


def test_importing_a_pickled_weights_file_runs_none_of_it(tmp_path, capsys):
    src, marker = explicit_folder(tmp_path / "received"), tmp_path / "marker"
    torch.save({"model.embed_tokens.weight": Marker(marker)}, src / "pytorch_model.bin")
    assert load_tool("convert_checkpoint").main(["import", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"convert_checkpoint: {src / 'pytorch_model.bin'}: not a file of plain tensors; refused "
                          "without running any of it (") and err.count("\n") == 1, err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_importing_a_safetensors_file_with_a_crafted_header_is_one_line(tmp_path, capsys):
    src = explicit_folder(tmp_path / "received")
    header_too_large(src / "model.safetensors")
    assert load_tool("convert_checkpoint").main(["import", str(src), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"convert_checkpoint: {src / 'model.safetensors'}: not a whole safetensors "
                                       "file (SafetensorError: Error while deserializing header: header too large)\n")


def test_a_config_that_does_not_describe_the_weights_is_refused_before_the_model_is_built(tmp_path, capsys):
    """A received config.json's sizes are checked against the weights file's header first: a crafted
    d_model would otherwise allocate what it says (2^20: terabytes) before any weight is read."""
    export = write_tiny_export("mamba2-explicit", tmp_path)
    config = json.loads((export / "config.json").read_text())
    width, rows = config["implicit_megatron"]["model"]["d_model"], config["vocab_size"]  # rows: padded
    config["implicit_megatron"]["model"]["d_model"] = config["hidden_size"] = 4096  # the config agrees with itself
    (export / "config.json").write_text(json.dumps(config))
    assert load_tool("generate").main([str(export), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err == (f"generate: {export / 'model.safetensors'}: embedding.weight is "
                                       f"[{rows}, {width}] here, but the model {export / 'config.json'} describes "
                                       f"has [{rows}, 4096]\n")


def nan_tensor(export: pathlib.Path) -> str:
    """An export whose first floating tensor is all NaN: returns its name."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(export / "model.safetensors"))
    name = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, str(export / "model.safetensors"), metadata={"format": "pt"})
    return name


def test_an_export_with_non_finite_weights_is_refused_naming_the_tensor_and_the_file(tmp_path, capsys):
    """A NaN weight evaluates to a NaN perplexity with exit 0: refused at load, by every reader."""
    from transformers import AutoModelForCausalLM

    from implicit_megatron import from_pretrained
    from implicit_megatron.checkpoints.weights_file import WeightsFileError

    export = write_tiny_export("mamba2-explicit", tmp_path)
    name = nan_tensor(export)
    said = f"{export / 'model.safetensors'}: {name} holds values that are not finite (NaN or inf:"
    with pytest.raises(WeightsFileError, match=re.escape(said)):
        from_pretrained(export)
    with pytest.raises(WeightsFileError, match=re.escape(said)):
        AutoModelForCausalLM.from_pretrained(export)
    capsys.readouterr()  # transformers' progress bar
    assert load_tool("generate").main([str(export), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err.startswith(f"generate: {said}")
