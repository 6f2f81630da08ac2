"""Weights out of DeepSpeed checkpoints: a consolidated folder that `from_pretrained` loads.

An exported folder holds `model.safetensors` (float32 or bfloat16; weight normalisation folded
into plain weights; the tied head stored once, as the embedding), `config.json` (the resolved
run config) and the tokenizer file the run used.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from implicit_megatron.builder import build_model, remove_weight_norm
from implicit_megatron.config import Config
from implicit_megatron.models.lm import LanguageModel
from implicit_megatron.train.checkpoint import read_latest
from implicit_megatron.utils.typed_yaml import build_dataclass

MODEL_FILE, CONFIG_FILE = "model.safetensors", "config.json"


def config_from_dict(data: dict, source: str) -> Config:
    cfg = build_dataclass(Config, data, {k: source for k in data})
    cfg.source = source
    return cfg


def read_checkpoint(ckpt_dir: str | Path, tag: str | None = None) -> tuple[dict[str, torch.Tensor], Config]:
    """The full-precision model state and the run config of one checkpoint tag (default: latest)."""
    folder = Path(ckpt_dir)
    tag = tag or read_latest(folder)
    if tag is None:
        raise FileNotFoundError(f"{folder}: not a checkpoint folder (no 'latest' file); name a tag with --tag")
    states = folder / tag / "mp_rank_00_model_states.pt"
    if not states.is_file():
        raise FileNotFoundError(f"{folder}: no complete checkpoint with tag {tag!r} ({states.name} missing)")
    saved = torch.load(states, map_location="cpu", weights_only=False)
    if "config" not in saved:
        raise ValueError(f"{states}: no run config in this checkpoint; was it written by implicit_megatron.train?")
    cfg = config_from_dict(saved["config"], str(states))
    if cfg.distributed.zero_stage == 0:
        state = {k: v.float() for k, v in saved["module"].items()}
    else:  # the fp32 master weights are partitioned across the optimizer states
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)
    return state, cfg


def export(ckpt_dir: str | Path, out_dir: str | Path, tag: str | None = None, dtype: str = "fp32") -> Path:
    from safetensors.torch import save_file

    state, cfg = read_checkpoint(ckpt_dir, tag)
    model = build_model(cfg)
    model.load_state_dict(state, strict=True)  # a shape mismatch names the tensor
    remove_weight_norm(model)
    cfg.implicit.weight_norm = False
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    tensors = {k: v.detach().to(torch_dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / MODEL_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    tokenizer = Path(cfg.data.tokenizer)
    if tokenizer.is_file():
        shutil.copy(tokenizer, out / tokenizer.name)
    return out


def from_pretrained(folder: str | Path, device=None, dtype=None) -> LanguageModel:
    """Load a folder written by `export` (tools/convert_checkpoint.py export)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (CONFIG_FILE, MODEL_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder}: no {name}; export a checkpoint with tools/convert_checkpoint.py")
    cfg = config_from_dict(json.loads((folder / CONFIG_FILE).read_text()), str(folder / CONFIG_FILE))
    model = build_model(cfg)
    state = load_file(str(folder / MODEL_FILE))
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in state.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()
