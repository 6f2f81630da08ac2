"""Parameter counts of the paper's configurations (built on the meta device: no memory, no init cost)."""

from __future__ import annotations

import pytest
import torch

from implicit_megatron import build_model, load_config

# Public Mamba2 checkpoints (tied embeddings, vocabulary padded to 50288) and the Llama sizes of Table 6.
EXPECTED = {
    ("mamba2", "130m"): (129e6, 0.03),
    ("mamba2", "370m"): (371e6, 0.03),
    ("mamba2", "780m"): (779e6, 0.03),
    ("mamba2", "1.3b"): (1.34e9, 0.03),
    ("llama", "130m"): (125e6, 0.05),
    ("llama", "350m"): (350e6, 0.05),
    ("llama", "760m"): (760e6, 0.05),
    ("llama", "1.3b"): (1.3e9, 0.05),
}
LLAMA_FFN = {"130m": 2048, "350m": 2816, "760m": 4096, "1.3b": 5632}


@pytest.mark.parametrize(("arch", "size"), list(EXPECTED))
def test_paper_config_sizes(arch, size):
    cfg = load_config(f"configs/{arch}/{size}-explicit.yaml", check_files=False)
    model = build_model(cfg, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    total, body = model.num_parameters(), model.num_parameters(exclude_embedding=True)
    target, tolerance = EXPECTED[(arch, size)]
    print(f"{arch} {size}: {total / 1e6:.1f}M parameters ({body / 1e6:.1f}M without the embedding), "
          f"target {target / 1e6:.0f}M")
    assert abs(total - target) / target < tolerance
    if arch == "llama":
        assert cfg.model.llama.mlp_width(cfg.model.d_model) == LLAMA_FFN[size]
        assert model.backbone.layers[0].mlp.up_proj.weight.shape == (LLAMA_FFN[size], cfg.model.d_model)
    else:
        assert cfg.model.padded_vocab_size == 50288


def test_meta_model_is_cheap_to_materialise_shape_only():
    cfg = load_config("configs/mamba2/130m-explicit.yaml", check_files=False)
    model = build_model(cfg, device="meta")
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    assert model(ids).shape == (1, 8, 50288)
