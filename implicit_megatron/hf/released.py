"""Models released with the paper (package `implicit_llm`) in and out of our folder format.

The released folders (`config.json` with `model_type` implicit_llama3 / implicit_mamba2 and
`pytorch_model.bin`) hold implicit, "(4+1) pretrain" and explicit models. Every tensor has one
place here (weight norm stays weight norm: `weight_g`/`weight_v` are the parametrization's
`original0`/`original1`), every setting one key; anything else is refused by name. The solver
settings come along (`deq_params`), and the model evaluates by the released rule
(`implicit.eval_rule: released`), so `from_pretrained(OUT)` computes what the released code
computes. `export_released` writes the reverse.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import torch

from implicit_megatron.builder import build_model
from implicit_megatron.config import Config, read_config
from implicit_megatron.hf.export import write_folder
from implicit_megatron.hf.import_explicit import DEFAULT_BASE, read_source, source_name
from implicit_megatron.hf.import_tokenizer import matching_tokenizer
from implicit_megatron.models.registry import SPECS, spec_of
from implicit_megatron.utils.whole_folder import written_whole

logger = logging.getLogger(__name__)

MODEL_TYPES = {spec.released_model_type: name for name, spec in SPECS.items()}  # the backbones' specs say theirs
WN = {"weight_g": "parametrizations.weight.original0", "weight_v": "parametrizations.weight.original1"}
TOP = {"word_emb.emb.weight": "embedding.weight", "backbone.norm_f.weight": "core.backbone.norm_f.weight",
       "backbone.injection_norm.weight": "core.injection.norm.weight", "backbone.injection.": "core.injection.proj.",
       "criterion.decoder.weight": "lm_head.weight"}
# settings read elsewhere, or without effect on the function (the released code never reads them)
IGNORED = {"architectures", "average_eval", "data_info", "dataset_name", "emb_init_std", "keep_sequence_dim",
           "save_output_ids", "masked_training", "load_from_pretrained_shell", "tokenizer", "torch_dtype",
           "transformers_version", "weight_decay", "_name_or_path", "d_embed", "vocab_size", "n_tokens",
           "pad_vocab", "pad_vocab_size_multiple", "tie_embeddings", "head_bias", "dropout", "model_type",
           "backbone_type", "backbone_config", "deq_params"}


def is_released(hf: dict) -> bool:
    return hf.get("model_type") in MODEL_TYPES


def _refuse(src: Path, key: str, value, why: str) -> None:
    raise ValueError(f"{src / 'config.json'}: {key}={value!r}: {why}; this setting has no counterpart here")


def released_overrides(hf: dict, src: Path) -> list[str]:
    """Our config keys for a released config.json (model shape, vocabulary, solver, evaluation)."""
    unknown = sorted(set(hf) - IGNORED)
    if unknown:
        _refuse(src, unknown[0], hf[unknown[0]], "unknown key")
    spec = spec_of(MODEL_TYPES[hf["model_type"]])
    bb = dict(hf["backbone_config"])
    d_model = bb.pop("d_model")
    checks = {"pre_norm": True, "rms_norm": True}
    for key, want in checks.items():
        if bb.pop(key, want) != want:
            _refuse(src, f"backbone_config.{key}", not want, f"only {key}={want} is supported")
    if hf.get("d_embed", d_model) != d_model:
        _refuse(src, "d_embed", hf["d_embed"], "an embedding width other than d_model")
    if hf.get("head_bias"):
        _refuse(src, "head_bias", True, "a bias on the output head")
    if bb.pop("dropout", 0.0):  # the mixer's; its fused training path never applies it
        logger.warning("%s: backbone_config.dropout (the released mixer's, outside its fused training path) is "
                       "not applied here", src)
    bb.pop("init_gain", None)  # the released code never reads it
    if bb.pop("pretrain_steps", 0):
        logger.warning("%s: pretrain_steps (the unrolled warm-up) is a training setting; not applied here", src)
    bb.pop("pretrain_iter", None)
    fp32_residual = str(bool(bb.pop("residual_in_fp32", True))).lower()  # the released default: true
    vocab = spec.released_vocab(hf)
    multiple = hf.get("pad_vocab_size_multiple", 8) if hf.get("pad_vocab") else 1
    out = [f"model.arch={spec.name}", f"model.d_model={d_model}", f"model.n_layers={bb.pop('n_layer')}",
           "model.norm_eps=1e-05", f"model.vocab_size={vocab}", f"model.pad_vocab_multiple={multiple}",
           f"model.tie_embeddings={str(bool(hf.get('tie_embeddings', True))).lower()}",
           f"model.residual_in_fp32={fp32_residual}", "model.init=released",
           f"model.embedding_dropout={float(hf.get('dropout', 0.0))}"]
    block = dict(bb.pop("block_cfg", {}))
    d_inner = bb.pop("d_inner", 0)
    out += spec.released_overrides(block, bb, d_inner, lambda key, value, why: _refuse(src, key, value, why),
                                   lambda what: logger.warning("%s: %s", src, what))
    for name, rest in (("backbone_config.block_cfg", block), ("backbone_config", bb)):
        if rest:
            key = next(iter(rest))
            _refuse(src, f"{name}.{key}", rest[key], "unknown key")
    if hf["backbone_type"] == "explicit" or "explicit" in hf["backbone_type"]:
        return [*out, "implicit.enabled=false", "curriculum.phases=[]"]
    return [*out, *_solver_overrides(hf["deq_params"], src)]


def _solver_overrides(deq: dict, src: Path) -> list[str]:
    solver, training, norm = deq.get("solver", {}), deq.get("training", {}), deq.get("norm", {})
    regularization = deq.get("regularization", {})
    wanted = [("solver.f_solver", solver.get("f_solver", "fixed_point_iter"), "fixed_point_iter"),
              ("solver.f_stop_mode", solver.get("f_stop_mode", "rel"), "rel"),
              ("training.core", training.get("core", "sliced"), "sliced"),
              ("training.ift", training.get("ift", False), False),
              ("training.n_states", training.get("n_states", 1), 1),
              ("norm.norm_no_scale", norm.get("norm_no_scale", False), False),
              ("norm.norm_clip", norm.get("norm_clip", False), False),
              ("regularization.jac_loss_weight", regularization.get("jac_loss_weight", 0.0), 0.0)]
    for key, value, want in wanted:
        if value != want:
            _refuse(src, f"deq_params.{key}", value, f"only {want!r} is supported")
    max_iter = int(solver["f_max_iter"])
    eval_cap = int(solver.get("eval_f_max_iter", 0)) or int(max_iter * float(solver.get("eval_factor", 4.0)))
    weight_norm = norm.get("norm_type", "weight_norm") == "weight_norm"
    return ["implicit.enabled=true", "implicit.injection=true", "curriculum.phases=[]",
            f"implicit.max_iter={max_iter}", f"implicit.tol={float(solver['f_tol'])}",
            f"implicit.phantom_steps={int(training.get('grad', 1))}",
            f"implicit.damping={float(training.get('tau', 0.8))}",
            f"implicit.eval_max_iter={eval_cap}", "implicit.eval_rule=released",
            f"implicit.weight_norm={str(weight_norm).lower()}",
            f"implicit.weight_norm_injection={str(weight_norm).lower()}"]


def released_state(weights: dict[str, torch.Tensor], arch: str, tied: bool, src: Path) -> dict[str, torch.Tensor]:
    """Our names for the released tensors; any tensor without a place is refused by name."""
    layer_map = spec_of(arch).released_layer_names
    state = {}
    for name, tensor in weights.items():
        ours = _our_name(name, layer_map)
        if ours is None:
            raise ValueError(f"{src}: tensor {name!r} has no place in an implicit-megatron {arch} model")
        if ours == "lm_head.weight" and tied:
            if not torch.equal(tensor, weights["word_emb.emb.weight"]):
                raise ValueError(f"{src}: tie_embeddings is true but criterion.decoder.weight differs from "
                                 "word_emb.emb.weight")
            continue
        state[ours] = tensor
    return state


def _our_name(name: str, layer_map: dict[str, str]) -> str | None:
    name = re.sub(r"\.weight_([gv])$", lambda m: "." + WN[f"weight_{m.group(1)}"], name)
    match = re.match(r"backbone\.layers\.(\d+)\.(.+)$", name)
    if match:
        index, rest = match.groups()
        prefix = next((p for p in layer_map if rest.startswith(p)), None)
        return None if prefix is None else f"core.backbone.layers.{index}.{layer_map[prefix]}{rest[len(prefix):]}"
    prefix = next((p for p in TOP if name.startswith(p)), None)
    return None if prefix is None else TOP[prefix] + name[len(prefix):]


def import_released(src: str | Path, out_dir: str | Path, base_config: str | Path | None = None,
                    tokenizer: str | Path | None = None) -> Path:
    """Write our folder for the released model at `src`; `from_pretrained(out_dir)` evaluates it as the
    released code does."""
    src, out = Path(src), Path(out_dir)
    hf, weights = read_source(src)
    cfg: Config = read_config(Path(base_config) if base_config else DEFAULT_BASE,
                              [f"name={source_name(src)}", *released_overrides(hf, src)])
    state = released_state(weights, cfg.model.arch, cfg.model.tie_embeddings, src)
    dtype = weights["word_emb.emb.weight"].dtype
    model = build_model(cfg, dtype=dtype)
    expected = model.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise ValueError(f"{src}: tensor {name!r} has no place in the model this config describes")
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{src}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                             f"{tuple(expected[name].shape)}")
    missing = [k for k in expected if k not in state]
    if missing:
        raise ValueError(f"{src}: no tensor for {missing[0]!r}" + (f" and {len(missing) - 1} more" if
                                                                    len(missing) > 1 else ""))
    model.load_state_dict(state, strict=True)
    chosen = matching_tokenizer(src, hf, cfg, tokenizer, base_config)
    return write_folder(out, model, cfg, dtype, chosen)


# --------------------------------------------------------------------------- export


def released_config(cfg: Config, dtype: torch.dtype) -> dict:
    """The released code's config.json for our model (the inverse of `released_overrides`)."""
    m, spec = cfg.model, spec_of(cfg.model.arch)
    block, extra = spec.released_block(m)
    padded = m.padded_vocab_size != m.vocab_size
    hf = {"model_type": spec.released_model_type, "architectures": [spec.released_architecture],
          "backbone_type": "implicit" if cfg.implicit.enabled else "explicit",
          "backbone_config": {"d_model": m.d_model, "n_layer": m.n_layers, "pre_norm": True, "rms_norm": True,
                              "dropout": 0.0, "residual_in_fp32": m.residual_in_fp32, "block_cfg": block, **extra},
          "deq_params": _released_deq(cfg) if cfg.implicit.enabled else {},
          "d_embed": m.d_model, "tie_embeddings": m.tie_embeddings, "head_bias": False,
          "dropout": m.embedding_dropout,
          "pad_vocab": padded, "pad_vocab_size_multiple": m.pad_vocab_multiple if padded else 8,
          "tokenizer": "EleutherAI/gpt-neox-20b", "torch_dtype": str(dtype).removeprefix("torch.")}
    return {**hf, **spec.released_vocab_fields(m.vocab_size)}


def _released_deq(cfg: Config) -> dict:
    c = cfg.implicit
    if c.eval_rule != "released":
        logger.warning("implicit.eval_rule=%s: the released code evaluates by its own rule", c.eval_rule)
    tol = c.tol if c.tol is not None else c.eval_tol
    if tol is None:
        raise ValueError("the released code always stops at a tolerance: set implicit.tol or implicit.eval_tol")
    return {"solver": {"f_solver": "fixed_point_iter", "b_solver": "fixed_point_iter", "f_max_iter": c.max_iter,
                       "b_max_iter": c.max_iter, "f_tol": tol, "b_tol": 1e-3, "f_stop_mode": "rel",
                       "b_stop_mode": "rel", "eval_factor": float(c.eval_factor),
                       "eval_f_max_iter": c.eval_max_iter or 0},
            "norm": {"norm_type": "weight_norm", "norm_no_scale": False, "norm_clip": False, "norm_clip_val": 1.0,
                     "norm_target_norm": 1.0, "sn_n_power_iters": 1},
            "training": {"core": "sliced", "grad": c.phantom_steps, "tau": c.damping, "ift": False, "hook_ift": False,
                         "n_states": 1, "indexing": [], "sup_gap": -1, "sup_loc": [], "gamma": 0.8},
            "regularization": {"jac_loss_weight": 0.0, "jac_loss_freq": 0.0, "jac_incremental": 0,
                               "sradius_mode": False}}


def released_tensors(model, cfg: Config) -> dict[str, torch.Tensor]:
    """Our model's tensors under the released names. Every Linear/Conv of an implicit backbone and
    its injection is stored as weight_g/weight_v, as the released code keeps them; a plain weight
    w becomes g = ||w|| per output row and v = w (the same function)."""
    inverse_layer = {v: k for k, v in spec_of(cfg.model.arch).released_layer_names.items()}
    inverse_top = {v: k for k, v in TOP.items()}
    implicit = cfg.implicit.enabled
    out = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().clone()
        if name.endswith(".parametrizations.weight.original0") or name.endswith(".parametrizations.weight.original1"):
            base, which = name.rsplit(".parametrizations.weight.original", 1)
            out[_released_name(base + ".weight", inverse_layer, inverse_top)[:-len("weight")]
                + ("weight_g" if which == "0" else "weight_v")] = tensor
            continue
        released = _released_name(name, inverse_layer, inverse_top)
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else None
        if implicit and name.endswith(".weight") and isinstance(module, (torch.nn.Linear, torch.nn.Conv1d)) \
                and name.startswith("core."):
            dims = tuple(range(1, tensor.dim()))
            out[released[:-len("weight")] + "weight_g"] = torch.linalg.vector_norm(tensor, dim=dims, keepdim=True)
            out[released[:-len("weight")] + "weight_v"] = tensor
        else:
            out[released] = tensor
    if cfg.model.tie_embeddings:
        out["criterion.decoder.weight"] = out["word_emb.emb.weight"]
    return out


def _released_name(name: str, inverse_layer: dict[str, str], inverse_top: dict[str, str]) -> str:
    match = re.match(r"core\.backbone\.layers\.(\d+)\.(.+)$", name)
    if match:
        index, rest = match.groups()
        prefix = next(p for p in inverse_layer if rest.startswith(p))
        return f"backbone.layers.{index}.{inverse_layer[prefix]}{rest[len(prefix):]}"
    top = next((p for p in inverse_top if name.startswith(p)), None)
    if top is None:
        raise ValueError(f"tensor {name!r} has no released counterpart")
    return inverse_top[top] + name[len(top):]


def export_released(model, cfg: Config, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """A folder the released code loads (`from_pretrained`) and evaluates to the same logits."""
    hf = released_config(cfg, dtype)
    tensors = {k: v.to(dtype) for k, v in released_tensors(model, cfg).items()}
    if cfg.model.tie_embeddings:
        tensors["criterion.decoder.weight"] = tensors["word_emb.emb.weight"]  # one storage, as saved there
    with written_whole(out_dir) as out:
        torch.save(tensors, out / "pytorch_model.bin")
        (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
        (out / "generation_config.json").write_text(json.dumps({"_from_model_config": True}, indent=2) + "\n")
    return Path(out_dir)


STORED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float64": torch.float64}


def export_released_from(path: str | Path, out_dir: str | Path, tag: str | None = None,
                         dtype: torch.dtype | None = None) -> Path:
    """`export_released` of a run's checkpoint (a checkpoints/ folder, `tag` or latest) or of one of
    our model folders (export/import output), in `dtype` (default: the dtype it is stored in)."""
    from implicit_megatron.hf.export import from_pretrained, read_checkpoint
    from implicit_megatron.hf.export_reader import MODEL_FILE, read_export_config

    path = Path(path)
    if os.path.lexists(path / MODEL_FILE):
        export = read_export_config(path)  # torch_dtype one of STORED_DTYPES' names, or none: float32
        model = from_pretrained(path, dtype=STORED_DTYPES[export.dtype or "float32"])
        cfg = export.cfg
    else:
        state, cfg = read_checkpoint(path, tag)
        model = build_model(cfg)
        model.load_state_dict(state, strict=True)
    return export_released(model, cfg, out_dir, dtype or next(model.parameters()).dtype)
