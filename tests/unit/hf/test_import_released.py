"""Models released with the paper: imported, they compute what the released code computed (fixture
made by that code: tests/fixtures/released/README.md); exported, they come back bit for bit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from support.word_tokenizer import write_word_tokenizer

from implicit_megatron import from_pretrained
from implicit_megatron.hf.released import _our_name, import_released
from implicit_megatron.models.registry import spec_of

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests/fixtures/released"
ARCHS = ["llama", "mamba2"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("imported")
    return {arch: import_released(FIXTURES / arch, out / arch, tokenizer=words(out, arch)) for arch in ARCHS}


def words(folder: Path, arch: str) -> Path:
    """A tokenizer of a fixture's vocabulary (Llama 64 tokens, Mamba2 60 in 64 rows); the released config
    names GPT-NeoX's, of 50,277."""
    size = 64 if arch == "llama" else 60
    return write_word_tokenizer(folder / f"words-{size}" / "tokenizer.json", size)


def reference(arch: str):
    folder = FIXTURES / arch
    meta = json.loads((folder / "meta.json").read_text())
    return (load_file(str(folder / "inputs.safetensors"))["input_ids"], load_file(str(folder / "logits.safetensors")),
            load_file(str(folder / "grads.safetensors")), meta)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


TOLERANCE = 1e-6  # the largest error, in Llama's gradients, is 1.7e-7; a wrong norm_eps alone is 6.4e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_imported_models_give_the_released_logits_in_eval_and_train_mode(arch, imported):
    ids, logits, _, meta = reference(arch)
    model = from_pretrained(imported[arch], dtype=torch.float64)
    settings = model.core.settings  # the released 130m solver, carried over from deq_params
    assert (settings.max_iter, settings.tol, settings.phantom_steps, settings.damping) == (32, 0.05, 4, 0.8)
    assert settings.eval_rule == "released" and settings.cap(False) == 128
    assert settings.eval_stop == "token"  # what an unnamed client gets; the released rule is named:
    model.core.set_phase(eval_stop="batch")  # the reference ran its batch under one stop test
    with torch.no_grad():
        assert relative(model(ids), logits["eval"]) < TOLERANCE
    assert model.core.last_stats.passes == meta["runs"]["eval"]["f_calls"]  # damped passes + the last one
    model.train()
    assert relative(model(ids).detach(), logits["train"]) < TOLERANCE


@pytest.mark.parametrize("arch", ARCHS)
def test_same_function_and_gradients_as_the_released_code_at_4p1(arch, imported):
    ids, logits, grads, _ = reference(arch)
    model = from_pretrained(imported[arch], dtype=torch.float64).train()
    model.core.set_phase(max_iter=4, phantom_steps=1)  # the released "(4+1) pretrain" solver
    out = model(ids)
    assert relative(out.detach(), logits["train_4p1"]) < TOLERANCE
    F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    params = dict(model.named_parameters())
    layers = spec_of(arch).released_layer_names
    checked = 0
    for key, want in grads.items():
        run, name = key.split(":", 1)
        if run != "train_4p1":
            continue
        ours = _our_name(name, layers)
        ours = "embedding.weight" if ours == "lm_head.weight" else ours  # tied
        assert relative(params[ours].grad, want) < TOLERANCE, name
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("arch", ARCHS)
def test_sequential_mode_follows_the_released_per_token_rule(arch, imported):
    ids, logits, _, meta = reference(arch)
    model = from_pretrained(imported[arch], dtype=torch.float64)
    # the reference ran its batch of 2 under one stop test per token, as the released code does
    model.core.set_phase(sequential_stop="batch")
    z, _, stats = model.core.forward_sequential(model.embedding(ids))
    assert relative(model.logits(z), logits["sequential"]) < TOLERANCE
    assert [s.passes for s in stats] == meta["runs"]["sequential"]["f_calls_per_token"]


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/convert_checkpoint.py", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.mark.processes
@pytest.mark.parametrize("arch", ARCHS)
def test_export_released_then_import_is_bit_exact(arch, tmp_path):
    ours, released, again = tmp_path / "ours", tmp_path / "released", tmp_path / "again"
    tokenizer = ("--tokenizer", words(tmp_path, arch))
    for command in (("import", FIXTURES / arch, ours, *tokenizer), ("export", ours, released, "--format", "released"),
                    ("import", released, again, *tokenizer)):
        result = convert(*command)
        assert result.returncode == 0, result.stderr[-3000:]
    original = torch.load(FIXTURES / arch / "pytorch_model.bin", weights_only=True)
    written = torch.load(released / "pytorch_model.bin", weights_only=True)
    assert written.keys() == original.keys()
    assert all(torch.equal(written[k], original[k]) for k in original)
    first, second = load_file(str(ours / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    first, second = (json.loads((folder / "config.json").read_text()) for folder in (ours, again))
    # each import is named after its source folder; everything else round-trips
    assert (first["implicit_megatron"].pop("name"), second["implicit_megatron"].pop("name")) == (arch, "released")
    assert first == second
    assert first["implicit_megatron"]["data"]["seq_len"] == 2048  # the paper's: the source records none
    assert first["implicit_megatron"]["data"]["prefixes"] == []  # no tiny config's data comes along


def test_unmapped_settings_and_tensors_are_refused_by_name(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama", source)
    hf = json.loads((source / "config.json").read_text())
    hf["deq_params"]["training"]["core"] = "indexing"
    (source / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"deq_params.training.core='indexing'"):
        import_released(source, tmp_path / "out")
    hf["deq_params"]["training"]["core"] = "sliced"
    hf["backbone_config"]["block_cfg"]["window"] = 8
    (source / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"backbone_config.block_cfg.window=8: unknown key"):
        import_released(source, tmp_path / "out")
    del hf["backbone_config"]["block_cfg"]["window"]
    (source / "config.json").write_text(json.dumps(hf))
    weights = torch.load(source / "pytorch_model.bin", weights_only=True)
    weights["backbone.layers.0.mixer.extra.weight"] = torch.zeros(2)
    torch.save(weights, source / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"'backbone.layers.0.mixer.extra.weight' has no place"):
        import_released(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_whose_dtype_is_not_a_dtype_is_refused_naming_the_file(imported, tmp_path):
    """`torch_dtype` named any attribute of torch (getattr): a received folder's "Tensor" ended in
    an AttributeError traceback instead of a line naming the file."""
    from implicit_megatron.hf.released import export_released_from

    folder = Path(shutil.copytree(imported["mamba2"], tmp_path / "received"))
    described = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**described, "torch_dtype": "Tensor"}))
    with pytest.raises(ValueError, match=f"^{folder / 'config.json'}: torch_dtype: expected one of float32, "
                                         "bfloat16, float16, float64, got 'Tensor'"):
        export_released_from(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_received_base_config_naming_a_tokenizer_elsewhere_publishes_it_only_when_named(tmp_path, capsys):
    """A --base-config (or a checkpoint's config) from someone else may name a private tokenizer
    outside this repository, the working directory and the run: import and export copy it into the
    folder only when --tokenizer names it, and say where the copy came from."""
    from support.tools import load_tool

    private = write_word_tokenizer(tmp_path / "private" / "tokenizer.json.xz", 64)
    received = tmp_path / "received.yaml"
    received.write_text(f"base: {ROOT / 'configs/tiny/llama-implicit.yaml'}\ndata: {{tokenizer: {private}}}\n")
    convert = load_tool("convert_checkpoint").main
    args = ["import", str(FIXTURES / "llama"), str(tmp_path / "out"), "--base-config", str(received)]
    assert convert(args) == 2
    assert f"names {private}, outside the repository's data/ and the run folder" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert convert([*args, "--tokenizer", str(private)]) == 0
    assert (tmp_path / "out" / "tokenizer.json").is_file() and "tokenizer copied from .../private/tokenizer.json.xz" \
        in capsys.readouterr().out


def test_a_tokenizer_in_the_working_directory_is_published_only_when_named(tmp_path, capsys, monkeypatch):
    """Run from a home folder (or /), a received config naming a file there would have it copied into
    the export: only the run folder and the repository's data/ are taken without --tokenizer."""
    from support.tools import load_tool

    home = tmp_path / "home"
    home.mkdir()
    write_word_tokenizer(home / "private.json.xz", 64)
    received = home / "received.yaml"
    received.write_text(f"base: {ROOT / 'configs/tiny/llama-implicit.yaml'}\ndata: {{tokenizer: private.json.xz}}\n")
    monkeypatch.chdir(home)
    args = ["import", str(FIXTURES / "llama"), str(tmp_path / "out"), "--base-config", str(received)]
    assert load_tool("convert_checkpoint").main(args) == 2
    assert "names private.json.xz, outside the repository's data/ and the run folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
