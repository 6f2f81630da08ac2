"""The Llama backbone's facts (models.spec): its config section, rules and layers, its names and settings
in transformers' Llama folders and in the released implicit_llama3 checkpoints."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from implicit_megatron.models.spec import BackboneSpec, Fail, Refuse
from implicit_megatron.utils.domains import domain


@dataclass
class LlamaSettings:
    n_heads: int = domain(12, gt=0)  # attention heads
    n_kv_heads: int | None = domain(None, gt=0)  # None = n_heads (plain multi-head attention)
    ffn_dim: int | None = domain(None, gt=0)  # None = 8/3 * d_model rounded up to ffn_multiple_of (Llama recipe)
    ffn_multiple_of: int = domain(256, gt=0)  # the MLP width is rounded up to a multiple of this
    rope_theta: float = domain(10000.0, gt=1)  # RoPE base frequency
    attention_bias: bool = False  # bias in q/k/v/o projections

    def mlp_width(self, d_model: int) -> int:
        """ffn_dim, or the Llama recipe's 8/3 x d_model rounded up to ffn_multiple_of."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        m = self.ffn_multiple_of
        return m * math.ceil(int(8 * d_model / 3) / m)


class LlamaSpec(BackboneSpec):
    name = "llama"
    settings = LlamaSettings
    shape_keys = ("n_heads", "n_kv_heads", "ffn_dim", "ffn_multiple_of", "attention_bias")
    residual_projections = ("o_proj", "down_proj")
    released_model_type = "implicit_llama3"
    released_architecture = "ImplicitLlamaForCausalLM"
    released_layer_names = {"norm.": "input_layernorm.", "mixer.wq.": "self_attn.q_proj.",
                            "mixer.wk.": "self_attn.k_proj.", "mixer.wv.": "self_attn.v_proj.",
                            "mixer.out_proj.": "self_attn.o_proj.", "norm2.": "post_attention_layernorm.",
                            "mlp.w1.": "mlp.gate_proj.", "mlp.w3.": "mlp.up_proj.", "mlp.fc2.": "mlp.down_proj."}

    def check(self, settings: Any, d_model: int, fail: Fail) -> None:
        s = settings  # each field's own range is its domain (LlamaSettings); here the rules across fields
        if d_model % s.n_heads or (d_model // s.n_heads) % 2:
            fail("model.llama.n_heads", f"d_model {d_model} must split into n_heads {s.n_heads} heads "
                                        "of even size (RoPE rotates pairs)")
        if s.n_kv_heads is not None and s.n_heads % s.n_kv_heads:
            fail("model.llama.n_kv_heads", f"must divide n_heads {s.n_heads}, got {s.n_kv_heads}")

    def build_layer(self, cfg: Any, index: int, device=None, dtype=None) -> Any:
        from implicit_megatron.models.llama.layer import LlamaDecoderLayer

        s = cfg.llama
        return LlamaDecoderLayer(cfg.d_model, s.n_heads, s.mlp_width(cfg.d_model), n_kv_heads=s.n_kv_heads,
                                 rope_theta=s.rope_theta, attention_bias=s.attention_bias, norm_eps=cfg.norm_eps,
                                 layer_idx=index, use_kernels=cfg.use_kernels, residual_in_fp32=cfg.residual_in_fp32,
                                 device=device, dtype=dtype)

    def init_weights_(self, backbone: Any, cfg: Any) -> None:
        from implicit_megatron.models.llama.layer import init_weights_

        init_weights_(backbone, cfg.n_layers, cfg.init_std)

    def attention_flops(self, cfg: Any, seq_len: int) -> float:
        """Scores and values, 4 T d per layer per token (causal work not halved, as Megatron counts)."""
        return 4 * seq_len * cfg.d_model * cfg.n_layers

    def from_transformers(self, hf: dict) -> tuple[list[str], dict[str, str]] | None:
        if hf.get("model_type") != "llama":
            return None
        if hf.get("mlp_bias"):
            raise ValueError("config.json: mlp_bias=true is not supported (Llama MLPs have no biases here)")
        theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        heads = hf["num_attention_heads"]
        if hf.get("head_dim", hf["hidden_size"] // heads) * heads != hf["hidden_size"]:
            raise ValueError("config.json: head_dim x num_attention_heads must equal hidden_size")
        overrides = ["model.arch=llama", f"model.d_model={hf['hidden_size']}",
                     f"model.n_layers={hf['num_hidden_layers']}", f"model.norm_eps={hf['rms_norm_eps']}",
                     f"model.llama.n_heads={heads}", f"model.llama.n_kv_heads={hf.get('num_key_value_heads', heads)}",
                     f"model.llama.ffn_dim={hf['intermediate_size']}", f"model.llama.rope_theta={float(theta)}",
                     f"model.llama.attention_bias={str(bool(hf.get('attention_bias', False))).lower()}"]
        return overrides, {"model.embed_tokens.": "embedding.", "model.layers.": "core.backbone.layers.",
                           "model.norm.": "core.backbone.norm_f.", "lm_head.": "lm_head."}

    def transformers_fields(self, cfg: Any) -> dict:
        s = cfg.llama
        return {"num_attention_heads": s.n_heads, "num_key_value_heads": s.n_kv_heads or s.n_heads,
                "intermediate_size": s.mlp_width(cfg.d_model), "rope_theta": s.rope_theta}

    def released_vocab(self, hf: dict) -> int:
        return hf["vocab_size"]

    def released_vocab_fields(self, vocab: int) -> dict:
        return {"vocab_size": vocab}

    def released_overrides(self, block: dict, backbone: dict, d_inner: int, refuse: Refuse,
                           warn: Callable[[str], None]) -> list[str]:
        if backbone.pop("block_type", "transformer") != "transformer" or \
                backbone.pop("mlp_type", "llama_mlp") != "llama_mlp":
            refuse("backbone_config.mlp_type", "?", "only transformer blocks with llama_mlp")
        heads = block.pop("n_head")
        if block.pop("bias", False) or not block.pop("apply_rotary", True):
            refuse("backbone_config.block_cfg", "bias/apply_rotary", "attention biases or no RoPE")
        out = []
        max_seq_len = block.pop("max_seq_len", None)  # the RoPE table's length: the trained length
        if max_seq_len:
            out.append(f"data.seq_len={int(max_seq_len)}")
        return [*out, f"model.llama.n_heads={heads}", f"model.llama.n_kv_heads={block.pop('n_kv_heads', heads)}",
                f"model.llama.ffn_dim={int(2 * d_inner / 3)}",
                f"model.llama.rope_theta={block.pop('rope_theta', 500000.0)}", "model.llama.attention_bias=false"]

    def released_block(self, cfg: Any) -> tuple[dict, dict]:
        s = cfg.llama
        ffn = s.mlp_width(cfg.d_model)
        d_inner = -(-3 * ffn // 2)
        if int(2 * d_inner / 3) != ffn:
            raise ValueError(f"model.llama.ffn_dim={ffn}: the released MLP width int(2 d_inner / 3) cannot equal it")
        if s.n_kv_heads not in (None, s.n_heads) or s.attention_bias:
            raise ValueError("grouped-query attention and attention biases have no released counterpart")
        block = {"n_head": s.n_heads, "rope_theta": s.rope_theta}
        return block, {"d_inner": d_inner, "mlp_type": "llama_mlp", "block_type": "transformer"}

    def kernels_in_use(self, probe: Any) -> str:
        from implicit_megatron.models import kernels

        return "flash-attn" if kernels.flash_attn(probe) is not None else "sdpa"


SPEC = LlamaSpec()
