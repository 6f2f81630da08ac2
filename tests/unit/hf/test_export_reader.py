"""An export folder you received is read by one reader (hf/export_reader.py) whoever loads it: evaluation
and generation (`load_model`), `implicit_megatron.from_pretrained`, transformers' AutoModelForCausalLM
(the package's class, and the folder's own copy of it where the package is not installed). Its
config.json goes through the rules a YAML config goes through, and the weights file's header through
the shapes and the dtype that config says: each damage below is one error naming the file and the
key or tensor at fault, not an IndexError, a negative dimension or an OverflowError from deep inside."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.tiny_exports import NO_PACKAGE
from transformers import AutoModelForCausalLM

from implicit_megatron.evaluation.loading import load_model

NAME = "mamba2-explicit"  # the quickest to build; the reader reads the same fields of every backbone


def received(exports, tmp_path: Path) -> Path:
    return Path(shutil.copytree(exports[NAME], tmp_path / "received"))


def edit_config(folder: Path, section: str, key: str, value) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["implicit_megatron"][section][key] = value
    (folder / "config.json").write_text(json.dumps(config))


def n_layers_zero(folder: Path) -> str:
    edit_config(folder, "model", "n_layers", 0)
    return f"{folder / 'config.json'}: implicit_megatron.model.n_layers: expected an integer > 0, got 0"


def negative_width(folder: Path) -> str:
    edit_config(folder, "model", "d_model", -64)
    return f"{folder / 'config.json'}: implicit_megatron.model.d_model: expected an integer > 0, got -64"


def no_vocabulary_multiple(folder: Path) -> str:
    edit_config(folder, "model", "pad_vocab_multiple", 0)
    return f"{folder / 'config.json'}: implicit_megatron.model.pad_vocab_multiple: expected an integer > 0, got 0"


def integer_tensor(folder: Path) -> str:
    """The header's dtype of one tensor changed from F32 to I32 in place: the file keeps its length and
    every offset, so only the dtype says that these bytes are no longer the weights' floats."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    entry = b'"embedding.weight":{"dtype":"F32"'
    assert data[8:8 + length].count(entry) == 1
    path.write_bytes(data.replace(entry, entry.replace(b"F32", b"I32"), 1))
    return f"{path}: embedding.weight: dtype I32, expected F32 (torch_dtype float32 in {folder / 'config.json'})"


def not_json(folder: Path) -> str:
    (folder / "config.json").write_text("{bad")
    return f"{folder / 'config.json'}: not JSON ("


def a_folder(folder: Path) -> str:
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    return f"{folder / 'config.json'}: not a regular file (a folder, a FIFO or a device)"


def a_fifo(folder: Path) -> str:
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")  # a reader that opens it waits for a writer for ever
    return f"{folder / 'config.json'}: not a regular file (a folder, a FIFO or a device)"


def link_outside(folder: Path, name: str = "config.json") -> str:
    outside = folder.parent / f"elsewhere-{name}"
    (folder / name).rename(outside)
    (folder / name).symlink_to(outside)
    return f"{folder / name}: a symbolic link to {outside}, outside {folder}: an export folder holds its own files"


def a_link_outside(folder: Path) -> str:
    return link_outside(folder)


def weights_link_outside(folder: Path) -> str:
    return link_outside(folder, "model.safetensors")


DAMAGES = [n_layers_zero, negative_width, no_vocabulary_multiple, integer_tensor, not_json, a_folder, a_fifo,
           a_link_outside, weights_link_outside]
# transformers reads config.json itself before any code of ours runs: where it cannot (not JSON, not a
# file), its own error names the file; the rest reach our reader
TRANSFORMERS_OWN = {not_json: "is not a valid JSON file", a_folder: "Should have a `model_type` key in its config.json",
                    a_fifo: "Should have a `model_type` key in its config.json"}


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_a_damaged_export_is_one_error_naming_the_file_and_key_for_evaluation(damage, exports, tmp_path):
    folder = received(exports, tmp_path)
    said = damage(folder)
    with pytest.raises(ValueError, match="^" + re.escape(said)) as caught:
        load_model(folder)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_a_damaged_export_is_one_error_naming_the_file_and_key_for_transformers(damage, exports, tmp_path):
    folder = received(exports, tmp_path)
    said = damage(folder)
    if damage in TRANSFORMERS_OWN:
        with pytest.raises((OSError, ValueError), match=re.escape(TRANSFORMERS_OWN[damage])) as caught:
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        assert str(folder) in str(caught.value)
        return
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


def test_generate_says_it_in_one_line(exports, tmp_path, capsys):
    from support.tools import load_tool

    folder = received(exports, tmp_path)
    said = n_layers_zero(folder)
    assert load_tool("generate").main([str(folder), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err == f"generate: {said}\n"


def test_the_public_loader_reads_through_the_same_reader(exports, tmp_path):
    from implicit_megatron import from_pretrained

    folder = received(exports, tmp_path)
    said = integer_tensor(folder)
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        from_pretrained(folder)


def test_config_fields_that_contradict_the_run_config_are_refused_naming_the_key(exports, tmp_path):
    """The fields transformers and tools read (hidden_size, num_hidden_layers, vocab_size) say what the
    run config says; a folder where they differ was edited, and would give those tools another model."""
    folder = received(exports, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    width = config["implicit_megatron"]["model"]["d_model"]
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 4096}))
    with pytest.raises(ValueError, match="^" + re.escape(f"{folder / 'config.json'}: hidden_size: expected {width} "
                                                         "(implicit_megatron.model.d_model), got 4096")):
        load_model(folder)


def test_a_bfloat16_export_and_a_saved_one_load(exports, tmp_path):
    """What we write passes: bf16 weights with torch_dtype bfloat16, and transformers' save_pretrained,
    which names the dtype `dtype`."""
    from implicit_megatron import from_pretrained
    from implicit_megatron.hf.export import write_folder

    model = from_pretrained(exports[NAME])
    bf16 = write_folder(tmp_path / "bf16", model, load_model(exports[NAME]).cfg, torch.bfloat16)
    assert next(from_pretrained(bf16, dtype=torch.bfloat16).parameters()).dtype == torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(exports[NAME])
    hf.save_pretrained(tmp_path / "saved")
    assert "dtype" in json.loads((tmp_path / "saved" / "config.json").read_text())
    ids = torch.tensor([[5, 9, 2, 7]])
    assert torch.equal(from_pretrained(tmp_path / "saved")(ids), model(ids))


WITHOUT_THE_PACKAGE = NO_PACKAGE + """from transformers import AutoModelForCausalLM

said = {}
for folder in json.loads(sys.argv[1]):
    try:
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        said[folder] = "loaded"
    except Exception as err:
        said[folder] = f"{type(err).__name__}: {err}"
print(json.dumps(said))
"""


@pytest.mark.processes
def test_the_folders_own_code_refuses_the_same_damage_where_the_package_is_not_installed(exports, tmp_path):
    """transformers' trust_remote_code runs the folder's copy of the package's modules (hf/remote_code.py),
    the reader among them: the same errors, from the copy."""
    folders, expected = [], {}
    for damage in (n_layers_zero, negative_width, no_vocabulary_multiple, integer_tensor, a_link_outside):
        folder = Path(shutil.copytree(exports[NAME], tmp_path / damage.__name__ / "received"))
        expected[str(folder)] = damage(folder)
        folders.append(str(folder))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", WITHOUT_THE_PACKAGE, json.dumps(folders)], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    for folder, message in expected.items():
        kind, _, text = said[folder].partition(": ")
        assert kind in ("ConfigError", "WeightsFileError") and text.startswith(message), said[folder]
