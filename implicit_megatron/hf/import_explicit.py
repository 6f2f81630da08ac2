"""Weights in from explicit Mamba2 and Llama models, so that an implicit run can start from them.

Reads a folder with `config.json` and `model.safetensors` (or `pytorch_model.bin`) written by
`transformers` (Mamba2ForCausalLM, LlamaForCausalLM) or by mamba_ssm (MambaLMHeadModel), and
writes one that `from_pretrained` loads. With a base config naming an implicit model, the
injection module keeps its fresh initialisation; everything else comes from the source.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from implicit_megatron.builder import build_model
from implicit_megatron.config import Config, read_config
from implicit_megatron.hf.export import write_folder
from implicit_megatron.hf.import_tokenizer import matching_tokenizer
from implicit_megatron.models.registry import SPECS
from implicit_megatron.utils.json_config import read_json_config

DEFAULT_BASE = Path(__file__).resolve().parents[2] / "configs/parts/imported.yaml"  # what a source does not say


def source_name(src: Path) -> str:
    """An imported model's run name: its source folder's (or file's) name."""
    name = (src if src.is_dir() else src.parent).resolve().name
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
    return re.sub(r"\.{2,}", ".", name).lstrip(".") or "imported"  # a safe run name (utils.names)

def read_source(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and the weights (model.safetensors or pytorch_model.bin) of a model folder."""
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: no config.json")
    hf = read_json_config(src / "config.json")
    from implicit_megatron.checkpoints.weights_file import read_safetensors, read_torch_weights

    if (src / "model.safetensors").is_file():
        return hf, read_safetensors(src / "model.safetensors")
    if (src / "pytorch_model.bin").is_file():
        return hf, read_torch_weights(src / "pytorch_model.bin")
    raise FileNotFoundError(f"{src}: no model.safetensors or pytorch_model.bin")


def _model_settings(hf: dict) -> tuple[list[str], dict[str, str]]:
    """Overrides for our model section, and the renaming of the source's top-level prefixes, from the
    backbone whose spec recognises the folder (models/<arch>/spec.py: from_transformers)."""
    for spec in SPECS.values():
        found = spec.from_transformers(hf)
        if found is not None:
            return found
    raise ValueError(f"config.json: model_type {hf.get('model_type')!r} is neither a transformers Mamba2/Llama "
                     "nor a mamba_ssm Mamba2 model")


def import_explicit(src: str | Path, out_dir: str | Path, base_config: str | Path | None = None,
                    tokenizer: str | Path | None = None) -> Path:
    """Write our folder for the explicit model at `src` (made implicit when `base_config` says so)."""
    src, out = Path(src), Path(out_dir)
    hf, weights = read_source(src)
    overrides, prefixes = _model_settings(hf)
    tied = hf.get("tie_embeddings", hf.get("tie_word_embeddings", True))
    vocab = hf["vocab_size"]
    overrides += [f"model.vocab_size={vocab}", "model.pad_vocab_multiple=1",
                  f"model.tie_embeddings={str(bool(tied)).lower()}", "implicit.weight_norm=false"]
    if not base_config:  # the source's name and trained length, the rest from configs/parts/imported.yaml
        overrides = [f"name={source_name(src)}", *overrides]
        if hf.get("max_position_embeddings"):
            overrides.append(f"data.seq_len={int(hf['max_position_embeddings'])}")
    cfg: Config = read_config(Path(base_config) if base_config else DEFAULT_BASE, overrides)
    state = {}
    for name, tensor in weights.items():
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"{src}: unexpected tensor {name!r}")
        if prefix == "lm_head." and tied:
            continue
        state[prefixes[prefix] + name[len(prefix):]] = tensor
    if "embedding.weight" in state and state["embedding.weight"].shape[0] != vocab:
        cfg.model.vocab_size = state["embedding.weight"].shape[0]  # mamba_ssm stores the padded vocabulary
    model = build_model(cfg)
    expected = model.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise ValueError(f"{src}: tensor {name!r} has no place in the model")
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{src}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                             f"{tuple(expected[name].shape)}")
    missing = [k for k in expected if k not in state and not k.startswith("core.injection.")]
    if missing:
        raise ValueError(f"{src}: tensors missing for {missing[:5]}")
    model.load_state_dict({**expected, **state}, strict=True)
    chosen = matching_tokenizer(src, hf, cfg, tokenizer, base_config)
    return write_folder(out, model, cfg, torch.float32, chosen)
