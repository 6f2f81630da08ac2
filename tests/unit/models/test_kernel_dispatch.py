"""Which fused kernels the models pick, and flash-attn's call site (a stand-in with its signature).

The Mamba2 mixer's fused paths run mamba_ssm's own kernels in the kernel tier (tests/kernels/, on
CPU under Triton's interpreter) and on a GPU in tools/node/validate_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from implicit_megatron.models import kernels
from implicit_megatron.models.llama import LlamaDecoderLayer


def test_llama_flash_attention_path(monkeypatch, rel_err):
    def flash_attn_func(q, k, v, causal=False):
        rep = q.shape[2] // k.shape[2]
        q, k, v = (x.transpose(1, 2) for x in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)

    layer = LlamaDecoderLayer(32, 4, 48, n_kv_heads=2)
    z = torch.randn(2, 11, 32)
    with torch.no_grad():
        y_torch = layer(z)
        monkeypatch.setattr(kernels, "flash_attn", lambda x: flash_attn_func)
        y_flash = layer(z)
    assert rel_err(y_flash, y_torch) < 1e-12


@pytest.mark.parametrize("user_setting", [None, "0"])
def test_the_kernels_keep_their_autotuning_on_disk_unless_the_user_says_otherwise(monkeypatch, user_setting):
    """mamba_ssm's kernels autotune in every process anew (minutes on a fresh node) unless Triton
    caches the choices, which it reads when the kernels are imported."""
    import os

    if user_setting is None:
        monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    else:
        monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", user_setting)
    kernels._load_mamba_kernels.cache_clear()
    try:
        kernels._load_mamba_kernels()
        assert os.environ["TRITON_CACHE_AUTOTUNING"] == (user_setting or "1")
    finally:
        kernels._load_mamba_kernels.cache_clear()
