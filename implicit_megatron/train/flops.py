"""FLOPs of a training step counted with the passes the solver actually made, and MFU.

A pass without gradient costs a forward (2 FLOPs per weight per token); a phantom (or explicit)
pass costs forward + backward (6). The head and embedding run once with gradient. A backbone adds
what its weights do not count (the spec's attention_flops: Llama's attention scores and values).
"""

from __future__ import annotations

import torch

from implicit_megatron.config import Config
from implicit_megatron.models.registry import spec_of

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "MI300X": 1307.4, "MI325X": 1307.4,
                    "MI250X": 383.0, "L40S": 362.0}


def pass_flops_per_token(cfg: Config, backbone_params: int, seq_len: int) -> float:
    """Forward FLOPs of one backbone pass, per token."""
    return 2 * backbone_params + spec_of(cfg.model.arch).attention_flops(cfg.model, seq_len)


def step_flops(cfg: Config, backbone_params: int, tokens: float, seq_len: int, passes: float,
               phantom_passes: float) -> float:
    per_pass = pass_flops_per_token(cfg, backbone_params, seq_len)
    head = 2 * cfg.model.d_model * cfg.model.padded_vocab_size
    return tokens * (per_pass * passes + 3 * per_pass * phantom_passes + 3 * head)


def peak_flops_per_device(cfg: Config) -> float | None:
    if cfg.train.peak_tflops is not None:
        return cfg.train.peak_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().upper()
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None
