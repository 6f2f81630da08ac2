"""Small float64 implicit models for the implicit-core tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from implicit_megatron import build_model, load_config

ROOT = Path(__file__).resolve().parents[3]


def tiny_model(arch: str, *overrides: str, contractive: bool = False, seed: int = 0):
    """A two-layer implicit model in float64 with a small vocabulary.

    `contractive` shrinks the weights that read z and enlarges the injection, which makes
    F(z) = norm_f(z + blocks(z, inj)) a contraction: its fixed point exists and iteration finds it.
    """
    cfg = load_config(ROOT / f"configs/tiny/{arch}-implicit.yaml",
                      ["model.vocab_size=101", "implicit.weight_norm=false", *overrides], check_files=False)
    torch.manual_seed(seed)
    model = build_model(cfg).double()
    if contractive:
        with torch.no_grad():
            for name, p in model.core.backbone.named_parameters():
                if name.endswith(("in_proj.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                                  "gate_proj.weight", "up_proj.weight")):
                    p.mul_(0.1)
            model.core.injection.proj.weight.mul_(20.0)
    return model


@pytest.fixture(params=["mamba2", "llama"])
def arch(request) -> str:
    return request.param


@pytest.fixture
def make_model():
    return tiny_model
