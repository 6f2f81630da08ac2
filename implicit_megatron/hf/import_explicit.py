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


def _mamba2_overrides(d_model, n_layers, eps, d_state, expand, headdim, ngroups, d_conv, chunk_size, bias,
                      conv_bias) -> list[str]:
    flag = lambda value: str(bool(value)).lower()  # noqa: E731
    return ["model.arch=mamba2", f"model.d_model={d_model}", f"model.n_layers={n_layers}", f"model.norm_eps={eps}",
            f"model.mamba2.d_state={d_state}", f"model.mamba2.expand={expand}", f"model.mamba2.headdim={headdim}",
            f"model.mamba2.ngroups={ngroups}", f"model.mamba2.d_conv={d_conv}",
            f"model.mamba2.chunk_size={chunk_size}", f"model.mamba2.bias={flag(bias)}",
            f"model.mamba2.conv_bias={flag(conv_bias)}"]


def _model_settings(hf: dict) -> tuple[list[str], dict[str, str]]:
    """Overrides for our model section, and the renaming of the source's top-level prefixes."""
    if hf.get("model_type") == "llama":
        if hf.get("mlp_bias"):
            raise ValueError("config.json: mlp_bias=true is not supported (Llama MLPs have no biases here)")
        theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        heads = hf["num_attention_heads"]
        if hf.get("head_dim", hf["hidden_size"] // heads) * heads != hf["hidden_size"]:
            raise ValueError("config.json: head_dim x num_attention_heads must equal hidden_size")
        overrides = ["model.arch=llama", f"model.d_model={hf['hidden_size']}",
                     f"model.n_layers={hf['num_hidden_layers']}", f"model.norm_eps={hf['rms_norm_eps']}",
                     f"model.llama.n_heads={heads}",
                     f"model.llama.n_kv_heads={hf.get('num_key_value_heads', heads)}",
                     f"model.llama.ffn_dim={hf['intermediate_size']}", f"model.llama.rope_theta={float(theta)}",
                     f"model.llama.attention_bias={str(bool(hf.get('attention_bias', False))).lower()}"]
        return overrides, {"model.embed_tokens.": "embedding.", "model.layers.": "core.backbone.layers.",
                           "model.norm.": "core.backbone.norm_f.", "lm_head.": "lm_head."}
    if hf.get("model_type") == "mamba2":
        if hf.get("norm_before_gate", False) or not hf.get("rms_norm", True):
            raise ValueError("config.json: only Mamba2 with a gated RMSNorm after the gate is supported")
        overrides = _mamba2_overrides(
            hf["hidden_size"], hf["num_hidden_layers"], hf["layer_norm_epsilon"], hf["state_size"], hf["expand"],
            hf["head_dim"], hf["n_groups"], hf["conv_kernel"], hf["chunk_size"], hf.get("use_bias", False),
            hf.get("use_conv_bias", True))
        return overrides, {"backbone.embeddings.": "embedding.", "backbone.layers.": "core.backbone.layers.",
                           "backbone.norm_f.": "core.backbone.norm_f.", "lm_head.": "lm_head."}
    if "d_model" in hf and "ssm_cfg" in hf:  # mamba_ssm's MambaLMHeadModel
        ssm = hf["ssm_cfg"]
        if ssm.get("layer", "Mamba2") != "Mamba2" or hf.get("d_intermediate", 0):
            raise ValueError("config.json: only mamba_ssm Mamba2 models without MLP blocks are supported")
        overrides = _mamba2_overrides(
            hf["d_model"], hf["n_layer"], 1e-5, ssm.get("d_state", 128), ssm.get("expand", 2), ssm.get("headdim", 64),
            ssm.get("ngroups", 1), ssm.get("d_conv", 4), ssm.get("chunk_size", 256), ssm.get("bias", False),
            ssm.get("conv_bias", True))
        return overrides, {"backbone.embedding.": "embedding.", "backbone.layers.": "core.backbone.layers.",
                           "backbone.norm_f.": "core.backbone.norm_f.", "lm_head.": "lm_head."}
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
    return write_folder(out, model, cfg, torch.float32, tokenizer)
