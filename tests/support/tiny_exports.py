"""Tiny exported folders of each backbone, implicit and explicit, for the transformers tests."""

from __future__ import annotations

from pathlib import Path

import torch

from support.processes import ROOT

# the start of a `python -c` script that runs an export's own code as in a Python without the package
NO_PACKAGE = """
import importlib.abc, json, sys

class NoPackage(importlib.abc.MetaPathFinder):  # as in a Python where the package is not installed
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in ("implicit_megatron", "data_pipeline"):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)

sys.meta_path.insert(0, NoPackage())
"""
MODELS = ["mamba2-explicit", "mamba2-implicit", "llama-explicit", "llama-implicit"]
READS_Z = ("in_proj.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
WRITES = ("out_proj.weight", "o_proj.weight", "down_proj.weight")  # into the residual stream


def tiny_model(name: str, tol: float = 1e-5, scales: tuple[float, float, float] = (0.1, 10.0, 30.0)):
    """(model, config) of a two-layer, width-32 model; implicit ones contractive (small weights reading
    z, large ones writing the residual stream and the injection: `scales`) and solved to `tol`.
    (0.5, 3, 3) at tol 0.05 makes sequences of different lengths stop after different passes."""
    from implicit_megatron import build_model, load_config

    arch = name.split("-")[0]
    cfg = load_config(ROOT / f"configs/tiny/{name}.yaml",
                      ["model.d_model=32", f"data.tokenizer={ROOT / 'data/tokenizers/shakespeare-bpe-1000.json.xz'}",
                       "model.mamba2.headdim=8" if arch == "mamba2" else "model.llama.n_heads=2"])
    cfg.implicit.max_iter, cfg.implicit.tol, cfg.curriculum.phases = 20, tol, []  # one solver for every path
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    if cfg.implicit.enabled:
        with torch.no_grad():
            for param_name, p in model.core.backbone.named_parameters():
                if param_name.endswith(READS_Z):
                    p.mul_(scales[0])
                elif param_name.endswith(WRITES):
                    p.mul_(scales[1])  # the branches outweigh z in the residual stream: ~10 passes per token
            model.core.injection.proj.weight.mul_(scales[2])
    return model, cfg


def write_tiny_export(name: str, out: Path, tol: float = 1e-5, scales: tuple[float, float, float] = (0.1, 10.0, 30.0),
                      folder: str | None = None) -> Path:
    """`tiny_model` as `export` writes it, into out/folder (default: out/name)."""
    from implicit_megatron.hf.export import write_folder

    model, cfg = tiny_model(name, tol, scales)
    return write_folder(out / (folder or name), model, cfg, torch.float32)


def write_tiny_exports(out: Path) -> dict[str, Path]:
    return {name: write_tiny_export(name, out) for name in MODELS}
