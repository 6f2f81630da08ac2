"""Weights out of DeepSpeed checkpoints: a consolidated folder that `from_pretrained` loads.

An exported folder holds `model.safetensors` (float32 or bfloat16; weight normalisation folded
into plain weights; the tied head stored once, as the embedding), `config.json` (the resolved
run config under `implicit_megatron`, with the fields transformers reads), the tokenizer file
the run used, and `modeling_implicit_megatron.py` with the package's modules it needs
(hf/remote_code.py), through which transformers' AutoModelForCausalLM loads the folder with
trust_remote_code=True in a Python without the package (imported, the package registers its
classes: hf/auto.py, and none of the folder's code runs). config.json also holds what
transformers' `generate` reads there: the end-of-document token (bos, eos and pad, so that it
stops where tools/generate.py stops) and the padding rows of the vocabulary as `suppress_tokens`
(tools/generate.py samples from the real vocabulary only).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from implicit_megatron.builder import build_model, remove_weight_norm
from implicit_megatron.checkpoints.consolidate import consolidated_weights
from implicit_megatron.checkpoints.integrity import require_complete
from implicit_megatron.checkpoints.layout import find_checkpoint, model_states_file, read_client_state, saved_layout
from implicit_megatron.config import Config
from implicit_megatron.config.saved import config_from_dict
from implicit_megatron.errors import first_line
from implicit_megatron.hf.export_reader import CONFIG_FILE, CONFIG_KEY, MODEL_FILE, read_export, read_export_config
from implicit_megatron.hf.remote_code import AUTO_MAP, write_remote_code
from implicit_megatron.models.lm import LanguageModel
from implicit_megatron.models.registry import spec_of
from implicit_megatron.utils.safe_write import out_of_room, room_cause_of
from implicit_megatron.utils.whole_folder import written_whole

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # write_tokenizer writes one: byte-level BPE, sentencepiece
REPOSITORY = Path(__file__).resolve().parents[2]


def write_folder(out: Path, model: LanguageModel, cfg: Config, dtype: torch.dtype, tokenizer: str | Path | None = None,
                 places: tuple[Path, ...] = ()) -> Path:
    """model.safetensors + config.json + the tokenizer + the transformers modeling file, under the
    name `out` only once all are written (utils.whole_folder). The tokenizer: `tokenizer` where given
    (--tokenizer), else the config's, if it lies where `tokenizer_to_copy` allows."""
    source = tokenizer_to_copy(cfg, tokenizer, places)
    try:
        with written_whole(out) as partial:
            _write_files(partial, model, cfg, dtype, source)
    except Exception as err:
        if not out_of_room(err):
            raise
        left = "the folder there before is left as it was" if Path(out).exists() else "nothing is left under its name"
        cause = room_cause_of(err, Path(out).parent) or first_line(err)
        raise OSError(f"{out}: not written: {cause}; {left}") from None
    return Path(out)


def tokenizer_to_copy(cfg: Config, given: str | Path | None, places: tuple[Path, ...] = ()) -> Path:
    """The tokenizer file an export copies: `given` as it is; else the config's data.tokenizer when it
    lies in the repository's data/ (a relative name is looked for there too, as the run found it) or
    in `places` (the run's folder). A config may be someone else's (a checkpoint's, a --base-config),
    and a file it names elsewhere (the working directory included: a home folder, /) may be private:
    published only when named."""
    if given is not None:
        return Path(given)
    path = Path(cfg.data.tokenizer)
    if not path.is_absolute() and not path.exists() and (REPOSITORY / path).exists():
        path = REPOSITORY / path
    if not path.exists() or any(path.resolve().is_relative_to(p.resolve()) for p in (REPOSITORY / "data", *places)):
        return path
    raise ValueError(f"data.tokenizer of {cfg.source or 'the config'} names {cfg.data.tokenizer}, outside the "
                     f"repository's data/ and the run folder: an export copies such a file only when you name it "
                     f"(--tokenizer {path})")


def _write_files(out: Path, model: LanguageModel, cfg: Config, dtype: torch.dtype, tokenizer: Path) -> None:
    from safetensors.torch import save_file

    from data_pipeline.tokenizer import load_tokenizer

    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / MODEL_FILE), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out / MODEL_FILE, 0o666 & ~umask)  # safetensors writes 0600; others on a cluster must read it
    eod_id = write_tokenizer(tokenizer, out)
    # what the tokenizer does, as the shards' _stats.json records it (of the source: a sentencepiece
    # export's converted tokenizer.json describes itself otherwise than the .model the shards used)
    identity = load_tokenizer(tokenizer).identity() if eod_id is not None else None
    hf = {"architectures": ["ImplicitMegatronForCausalLM"], "model_type": "implicit_megatron", "auto_map": AUTO_MAP,
          "torch_dtype": str(dtype).removeprefix("torch."), **model_fields(cfg), **generation_fields(cfg, eod_id),
          "eval_stop": "token",  # each row's result is its own (hf/config.py); a client may name "batch"
          "tokenizer_source": portable(str(tokenizer)) if eod_id is not None else None,  # where the copy came from
          "tokenizer_identity": identity,  # data_pipeline.tokenizer.Tokenizer.identity
          CONFIG_KEY: portable(run_config(cfg))}
    (out / CONFIG_FILE).write_text(json.dumps(hf, indent=2))
    write_remote_code(out)  # last: a folder with its code is whole (utils.whole_folder)


def run_config(cfg: Config) -> dict:
    """The run config an export carries: with the solver it was taken at (read_checkpoint sets the
    phase's), which the saved config of a curriculum leaves to its phases."""
    from implicit_megatron.config.schema import PHASE_SOLVER_KEYS

    data = cfg.to_dict()
    data["implicit"].update({key: getattr(cfg.implicit, key) for key in PHASE_SOLVER_KEYS})
    return data


def model_fields(cfg: Config) -> dict:
    """The top-level fields that transformers and tools built on it read from any causal LM's config:
    the width of the logits (padding rows included), the model's size, and the length it was
    trained at as `max_position_embeddings` (neither backbone has a limit; tools size windows by it)."""
    m = cfg.model
    fields: dict[str, Any] = {"vocab_size": m.padded_vocab_size, "hidden_size": m.d_model,
                              "num_hidden_layers": m.n_layers, "max_position_embeddings": cfg.data.seq_len,
                              "tie_word_embeddings": m.tie_embeddings}
    return {**fields, **spec_of(m.arch).transformers_fields(m)}


def portable(value):
    """The run config without the writing machine's absolute paths: a path under the working
    directory or this repository becomes relative to it, any other keeps its last two parts after
    '.../' (what it was, not where)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        path = Path(value)
        for base in (Path.cwd(), REPOSITORY):
            if path.is_relative_to(base):
                return str(path.relative_to(base))
        return ".../" + "/".join(path.parts[-2:])
    return value


def generation_fields(cfg: Config, eod_id: int | None) -> dict:
    """What transformers' generate reads from config.json: the end-of-document token, and the
    padding rows of the vocabulary, which no target ever used, suppressed."""
    fields: dict = {}
    if eod_id is not None:
        fields.update(bos_token_id=eod_id, eos_token_id=eod_id, pad_token_id=eod_id)
    if cfg.model.padded_vocab_size > cfg.model.vocab_size:
        fields["suppress_tokens"] = list(range(cfg.model.vocab_size, cfg.model.padded_vocab_size))
    return fields


def write_tokenizer(source: Path, out: Path) -> int | None:
    """The run's tokenizer as transformers' AutoTokenizer reads it (AutoTokenizer reads config.json
    first: the package's registered config, hf/auto.py): tokenizer.json
    (decompressed), or a sentencepiece tokenizer.model, each with its tokenizer_config.json;
    nothing when the run had none at hand. Returns the end-of-document id (None without a
    tokenizer; evaluation.loading finds the copy here before data.tokenizer). The end-of-document
    token is also the pad token, as config.json's pad_token_id says, and padding goes on the left,
    as generation expects (the models take either side). No `model_max_length`: the models have
    no length limit (the paper evaluates at 2-8x the training length), and transformers would warn
    of indexing errors past any number written."""
    if not source.is_file():
        return None
    from data_pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(source)
    if tokenizer.kind == "sentencepiece":
        shutil.copy(source, out / "tokenizer.model")
        eos = tokenizer.backend.id_to_piece(tokenizer.eod_id)
        unk = tokenizer.backend.id_to_piece(tokenizer.backend.unk_id()) if tokenizer.backend.unk_id() >= 0 else eos
        settings = {"eos_token": eos, "bos_token": eos, "unk_token": unk}
        fast = write_fast_sentencepiece(out, tokenizer, settings)
        settings["tokenizer_class"] = "PreTrainedTokenizerFast" if fast else "SentencePieceBackend"
    else:
        tokenizer.backend.save(str(out / "tokenizer.json"))
        eos = tokenizer.backend.id_to_token(tokenizer.eod_id)
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": eos,
                    "unk_token": eos}
    settings.update(pad_token=eos, padding_side="left")
    settings["model_input_names"] = ["input_ids", "attention_mask"]  # no token_type_ids: the model takes none
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return tokenizer.eod_id


SENTENCEPIECE_PROBES = ("ROMEO: but soft, what light through yonder window breaks?", " a leading space",
                        "two  spaces\nand a newline", "\tdigits 0123456789 and ünïcödé")


def write_fast_sentencepiece(out: Path, tokenizer, settings: dict) -> bool:
    """tokenizer.json beside tokenizer.model: transformers' own conversion of the sentencepiece model
    (5.x converts it), which every transformers version loads as PreTrainedTokenizerFast; 4.x has no
    class that reads a plain sentencepiece model with its ids. Written only where the conversion
    gives sentencepiece's ids and text on the probes; False where it cannot be made here."""
    try:
        import transformers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return False
    if int(transformers.__version__.split(".")[0]) < 5:
        return False
    config = out / "tokenizer_config.json"
    config.write_text(json.dumps({**settings, "tokenizer_class": "PreTrainedTokenizerFast"}))
    try:
        fast = PreTrainedTokenizerFast.from_pretrained(str(out))
        ids = [tokenizer.encode(text) for text in SENTENCEPIECE_PROBES]
        same = all(fast(text)["input_ids"] == i for text, i in zip(SENTENCEPIECE_PROBES, ids, strict=True))
        same = same and all(fast.decode(i) == tokenizer.decode(i) for i in ids)
        if same:
            fast.backend_tokenizer.save(str(out / "tokenizer.json"))
        return same
    except (ValueError, OSError, ImportError):
        return False
    finally:
        config.unlink()


def read_folder_config(folder: Path) -> Config:
    """The run config of an exported folder, checked as a YAML config is (hf/export_reader.py)."""
    return read_export_config(folder).cfg


def read_checkpoint(ckpt_dir: str | Path, tag: str | None = None) -> tuple[dict[str, torch.Tensor], Config]:
    """The full-precision model state and the run config of one checkpoint tag (default: latest).

    The config's solver settings (implicit.max_iter, tol, phantom_steps) are those of the
    curriculum phase the checkpoint was saved in, so that a model built from it iterates as it
    was trained (e.g. (24+4) with tolerance 0.05 after the free phase, not the config's defaults).
    """
    folder, tag = find_checkpoint(ckpt_dir, tag)
    try:
        require_complete(folder, tag)
        saved = read_client_state(folder / tag)
        cfg = config_from_dict(saved["config"], str(model_states_file(folder / tag)))
        weights = consolidated_weights(folder / tag, saved_layout(folder / tag))
    except (OSError, ValueError):
        if not (folder / tag).exists():  # not damage: the tag went away while it was read
            raise FileNotFoundError(f"{folder / tag}: removed while it was being read (a training that is still "
                                    "running prunes checkpoints beyond checkpoint.keep_last); read a newer one, or "
                                    "copy the tag elsewhere first") from None
        raise
    for phase in cfg.curriculum.phases:
        if phase.name == saved.get("phase"):
            cfg.implicit = replace(cfg.implicit, **phase.solver_keys())
            cfg.implicit.phantom_steps = max(phase.phantom_steps, 1)  # (an unrolled warm-up has none)
    return weights, cfg


def export(ckpt_dir: str | Path, out_dir: str | Path, tag: str | None = None, dtype: str = "fp32",
           tokenizer: str | Path | None = None) -> Path:
    state, cfg = read_checkpoint(ckpt_dir, tag)
    model = build_model(cfg)
    model.load_state_dict(state, strict=True)  # a shape mismatch names the tensor
    remove_weight_norm(model)
    cfg.implicit.weight_norm = False
    run_folder = find_checkpoint(ckpt_dir, tag)[0].parent
    return write_folder(Path(out_dir), model, cfg, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype], tokenizer,
                        (run_folder,))


def from_pretrained(folder: str | Path, device=None, dtype=None) -> LanguageModel:
    """Load a folder written by `export` (tools/convert_checkpoint.py export), its config and the
    weights' header checked first (hf/export_reader.py)."""
    from implicit_megatron.checkpoints.weights_file import read_safetensors

    folder = Path(folder)
    cfg = read_export(folder).cfg
    model = build_model(cfg, dtype=dtype)  # built in the asked dtype, so that loading loses nothing
    state = read_safetensors(folder / MODEL_FILE)
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in state.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()
