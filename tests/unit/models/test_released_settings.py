"""The released models' settings one key away: `model.init: released` and `model.residual_in_fp32`."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils import parametrize

from implicit_megatron import build_model, load_config


def cfg_of(arch: str, kind: str, *overrides: str):
    return load_config(f"configs/tiny/{arch}-{kind}.yaml", list(overrides), check_files=False)


def plain_weight(module: torch.nn.Module) -> torch.Tensor:
    """The weight as initialised (weight norm starts at g = ||v||, so v is that weight)."""
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original1
    return module.weight


def kaiming_std(weight: torch.Tensor) -> float:
    """Standard deviation of PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return 1 / math.sqrt(weight.shape[1]) / math.sqrt(3)


@pytest.mark.parametrize("arch", ["mamba2", "llama"])
@pytest.mark.parametrize("kind", ["explicit", "implicit"])
def test_released_init(arch, kind):
    overrides = ["model.init=released", "model.d_model=128", "model.n_layers=4"]
    if kind == "implicit":
        overrides += ["implicit.weight_norm=true", "implicit.weight_norm_injection=true"]
    model = build_model(cfg_of(arch, kind, *overrides))
    n_layers, per_layer = 4, 1 if arch == "mamba2" else 2
    residual_names = ("out_proj", "o_proj", "down_proj")
    linears = [(n, m) for n, m in model.core.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    for name, layer in linears:
        weight = plain_weight(layer)
        bound = 1 / math.sqrt(weight.shape[1])
        # the released implicit models skip the rescale (weight norm renames the weight first)
        scale = 1 / math.sqrt(per_layer * n_layers) if kind == "explicit" and name.endswith(residual_names) else 1
        assert weight.abs().max() <= bound * scale, name
        assert weight.std().item() == pytest.approx(kaiming_std(weight) * scale, rel=0.1), name
        if layer.bias is not None:
            assert torch.count_nonzero(layer.bias) == 0, name
    assert model.embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)
    if kind == "implicit":
        assert parametrize.is_parametrized(model.core.injection.proj, "weight")


def test_default_init_is_unchanged_by_the_key():
    """model.init=default keeps Llama's N(0, init_std) Linear layers."""
    model = build_model(cfg_of("llama", "explicit", "model.d_model=128"))
    q = model.core.backbone.layers[0].self_attn.q_proj.weight
    assert q.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("arch", ["mamba2", "llama"])
def test_residual_in_fp32(arch):
    """bf16 blocks add their residuals in float32; the pass returns the iterate's dtype; a float64
    model computes the same function with the key on or off (no float32 rounding of float64)."""
    on = build_model(cfg_of(arch, "implicit", "model.residual_in_fp32=true"))
    off = build_model(cfg_of(arch, "implicit", "model.residual_in_fp32=false"))
    off.load_state_dict(on.state_dict())
    ids = torch.randint(0, on.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(on(ids), off(ids))
    on.to(torch.bfloat16)
    backbone = on.core.backbone
    z = torch.randn(2, 9, backbone.d_model, dtype=torch.bfloat16)
    inj = torch.randn(2, 9, backbone.injection_width, dtype=torch.bfloat16) * 0.1
    with torch.no_grad():
        assert backbone.layers[0](z, inj).dtype == torch.float32
        assert backbone(z, inj).dtype == torch.bfloat16
        state = backbone.allocate_state(2, 9, dtype=torch.bfloat16)
        out, _ = backbone.step(z[:, 0], state, inj[:, 0])
        assert out.dtype == torch.bfloat16
        assert on(ids).isfinite().all()
