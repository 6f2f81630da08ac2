"""The Mamba2 backbone's facts (models.spec): its config section, rules and layers, its names and settings
in transformers' Mamba2 and mamba_ssm folders and in the released implicit_mamba2 checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from implicit_megatron.models.spec import BackboneSpec, Fail, Refuse
from implicit_megatron.utils.domains import domain


@dataclass
class Mamba2Settings:
    """mamba_ssm's Mamba2 constructor keywords (same names, same defaults)."""

    d_state: int = domain(128, gt=0)  # SSM state size per head (N)
    d_conv: int = domain(4, gt=0)  # width of the causal depthwise convolution
    expand: int = domain(2, gt=0)  # d_inner = expand x d_model
    headdim: int = domain(64, gt=0)  # channels per SSM head (nheads = d_inner / headdim)
    ngroups: int = domain(1, gt=0)  # groups sharing B and C (as attention's key-value groups)
    chunk_size: int = domain(256, gt=0)  # chunk length of the SSD scan (a speed setting; the function is the same)
    conv_bias: bool = True  # bias in the convolution
    bias: bool = False  # bias in in_proj and out_proj
    dt_min: float = domain(0.001, gt=0)  # smallest initial step size dt
    dt_max: float = domain(0.1, gt=0)  # largest initial step size dt
    dt_init_floor: float = domain(1e-4, gt=0)  # floor of the initial dt
    A_init_range: tuple[float, float] = domain((1.0, 16.0), gt=0)  # range of the initial -A (A = -exp(A_log))

    def inner_width(self, d_model: int) -> int:
        """d_inner = expand x d_model."""
        return self.expand * d_model


# mamba_ssm's block settings a released config may state, with the values of our Mamba2
RELEASED_FIXED = {"norm_before_gate": False, "D_has_hdim": False, "rmsnorm": True, "dt_limit": None}
RELEASED_DEFAULTS = {"d_state": 128, "expand": 2, "headdim": 64, "ngroups": 1, "d_conv": 4, "chunk_size": 256,
                     "bias": False, "conv_bias": True}
NOISE_KEYS = ("noise_mode", "state_noise_db", "latent_noise_db")


def _flag(value) -> str:
    return str(bool(value)).lower()


def _overrides(d_model, n_layers, eps, d_state, expand, headdim, ngroups, d_conv, chunk_size, bias,
               conv_bias) -> list[str]:
    return ["model.arch=mamba2", f"model.d_model={d_model}", f"model.n_layers={n_layers}", f"model.norm_eps={eps}",
            f"model.mamba2.d_state={d_state}", f"model.mamba2.expand={expand}", f"model.mamba2.headdim={headdim}",
            f"model.mamba2.ngroups={ngroups}", f"model.mamba2.d_conv={d_conv}",
            f"model.mamba2.chunk_size={chunk_size}", f"model.mamba2.bias={_flag(bias)}",
            f"model.mamba2.conv_bias={_flag(conv_bias)}"]


class Mamba2Spec(BackboneSpec):
    name = "mamba2"
    settings = Mamba2Settings
    shape_keys = ("d_state", "d_conv", "expand", "headdim", "ngroups", "bias", "conv_bias")
    residual_projections = ("out_proj",)
    released_model_type = "implicit_mamba2"
    released_architecture = "ImplicitMambaForCausalLM"
    released_layer_names = {name: name for name in ("norm.", "mixer.dt_bias", "mixer.A_log", "mixer.D",
                                                    "mixer.in_proj.", "mixer.conv1d.", "mixer.norm.",
                                                    "mixer.out_proj.")}

    def check(self, settings: Any, d_model: int, fail: Fail) -> None:
        s = settings  # each field's own range is its domain (Mamba2Settings); here the rules across fields
        if not s.dt_min <= s.dt_max:
            fail("model.mamba2.dt_max", f"expected at least model.mamba2.dt_min ({s.dt_min}), got {s.dt_max}")
        low, high = s.A_init_range
        if not low <= high:
            fail("model.mamba2.A_init_range", f"expected low <= high, got {list(s.A_init_range)}")
        inner = s.inner_width(d_model)
        if inner % s.headdim:
            fail("model.mamba2.headdim", f"expand*d_model = {inner} is not divisible by headdim {s.headdim}")
        if (inner // s.headdim) % s.ngroups:
            fail("model.mamba2.ngroups", f"nheads = {inner // s.headdim} is not divisible by ngroups")

    def build_layer(self, cfg: Any, index: int, device=None, dtype=None) -> Any:
        from implicit_megatron.models.mamba2.block import Mamba2Block

        s = cfg.mamba2
        return Mamba2Block(
            cfg.d_model, index, norm_eps=cfg.norm_eps, residual_in_fp32=cfg.residual_in_fp32, device=device,
            dtype=dtype, d_state=s.d_state, d_conv=s.d_conv, expand=s.expand, headdim=s.headdim,
            ngroups=s.ngroups, A_init_range=tuple(s.A_init_range), dt_min=s.dt_min, dt_max=s.dt_max,
            dt_init_floor=s.dt_init_floor, bias=s.bias, conv_bias=s.conv_bias, chunk_size=s.chunk_size,
            use_kernels=cfg.use_kernels)

    def init_weights_(self, backbone: Any, cfg: Any) -> None:
        from implicit_megatron.models.mamba2.block import init_weights_

        init_weights_(backbone, cfg.n_layers)

    def from_transformers(self, hf: dict) -> tuple[list[str], dict[str, str]] | None:
        """transformers' Mamba2ForCausalLM, or mamba_ssm's MambaLMHeadModel with Mamba2 layers."""
        if hf.get("model_type") == "mamba2":
            if hf.get("norm_before_gate", False) or not hf.get("rms_norm", True):
                raise ValueError("config.json: only Mamba2 with a gated RMSNorm after the gate is supported")
            overrides = _overrides(
                hf["hidden_size"], hf["num_hidden_layers"], hf["layer_norm_epsilon"], hf["state_size"], hf["expand"],
                hf["head_dim"], hf["n_groups"], hf["conv_kernel"], hf["chunk_size"], hf.get("use_bias", False),
                hf.get("use_conv_bias", True))
            return overrides, {"backbone.embeddings.": "embedding.", "backbone.layers.": "core.backbone.layers.",
                               "backbone.norm_f.": "core.backbone.norm_f.", "lm_head.": "lm_head."}
        if "d_model" in hf and "ssm_cfg" in hf:  # mamba_ssm's MambaLMHeadModel
            ssm = hf["ssm_cfg"]
            if ssm.get("layer", "Mamba2") != "Mamba2" or hf.get("d_intermediate", 0):
                raise ValueError("config.json: only mamba_ssm Mamba2 models without MLP blocks are supported")
            overrides = _overrides(
                hf["d_model"], hf["n_layer"], 1e-5, ssm.get("d_state", 128), ssm.get("expand", 2),
                ssm.get("headdim", 64), ssm.get("ngroups", 1), ssm.get("d_conv", 4), ssm.get("chunk_size", 256),
                ssm.get("bias", False), ssm.get("conv_bias", True))
            return overrides, {"backbone.embedding.": "embedding.", "backbone.layers.": "core.backbone.layers.",
                               "backbone.norm_f.": "core.backbone.norm_f.", "lm_head.": "lm_head."}
        return None

    def released_vocab(self, hf: dict) -> int:
        return cast(int, hf.get("n_tokens", hf.get("vocab_size")))  # neither: refused by name as model.vocab_size

    def released_vocab_fields(self, vocab: int) -> dict:
        return {"n_tokens": vocab, "vocab_size": vocab}

    def released_overrides(self, block: dict, backbone: dict, d_inner: int, refuse: Refuse,
                           warn: Callable[[str], None]) -> list[str]:
        if backbone.pop("block_type", "mamba2") != "mamba2" or d_inner:
            refuse("backbone_config.d_inner", d_inner, "Mamba2 blocks with an MLP")
        noise = {key: block.pop(key) for key in NOISE_KEYS if key in block}
        levels = [noise.get("state_noise_db", 20.0), noise.get("latent_noise_db", 20.0)]  # released defaults
        if max(levels) > 0:
            warn(f"the released token-by-token Mamba2 path adds {noise.get('noise_mode', 'multiplicative')} noise "
                 f"({max(levels)} dB); not applied here")
        for key, fixed_value in RELEASED_FIXED.items():
            if key in block and block.pop(key) not in (fixed_value, [0.0, float("inf")]):
                refuse(f"backbone_config.block_cfg.{key}", "?", f"only {key}={fixed_value} is supported")
        out = []
        for key, default in RELEASED_DEFAULTS.items():
            value = block.pop(key, default)
            out.append(f"model.mamba2.{key}={_flag(value) if isinstance(value, bool) else value}")
        return out

    def released_block(self, cfg: Any) -> tuple[dict, dict]:
        s = cfg.mamba2
        block = {"d_state": s.d_state, "expand": s.expand, "headdim": s.headdim, "ngroups": s.ngroups,
                 "d_conv": s.d_conv, "chunk_size": s.chunk_size, "bias": s.bias, "conv_bias": s.conv_bias,
                 # the released token-by-token path adds noise unless switched off; ours has none
                 "noise_mode": "additive", "state_noise_db": 0.0, "latent_noise_db": 0.0}
        return block, {"d_inner": 0, "block_type": "mamba2"}

    def kernels_in_use(self, probe: Any) -> str:
        from implicit_megatron.models import kernels

        return "fused" if kernels.mamba_kernels(probe) is not None else "pytorch"


SPEC = Mamba2Spec()
