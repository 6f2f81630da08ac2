"""What the package knows of a backbone, in one place per backbone: `BackboneSpec`.

Each backbone is a folder of `models/` (mamba2/, llama/): its block modules and a `spec.py` whose
`SPEC` says everything the rest of the package needs to know of it, so that nothing outside
`models/` asks which backbone it has: its config section and rules, its layers and their
initialisation, the FLOPs of a pass, the settings that fix its tensors, and its names and settings in
transformers' and mamba_ssm's folders and in the paper's released checkpoints. `models.registry`
lists them; a third backbone is a new folder with its spec, named there and in the schema's
`model.arch`.

A spec imports no torch and nothing of the config (the config check before a launch reads it, and
the config's schema imports its settings section): its block modules are imported when a model is
built. Model configs reach it as they are (`ModelConfig`, typed `Any` here for that reason).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

Fail = Callable[..., None]  # config.blame's fail(key, message): raises a ConfigError naming the key
Refuse = Callable[[str, Any, str], None]  # a received folder's refusal: (key, value, why)


class BackboneSpec(ABC):
    name: str  # model.arch, and its settings section model.<name>
    settings: type  # the dataclass of model.<name>
    shape_keys: tuple[str, ...]  # keys of model.<name> that fix the names and shapes of the model's tensors
    residual_projections: tuple[str, ...]  # the Linear layers of a block that write into the residual stream
    released_model_type: str  # the released code's config.json model_type
    released_architecture: str  # ... and its class
    released_layer_names: dict[str, str]  # a released layer's tensor prefixes -> ours

    @abstractmethod
    def check(self, settings: Any, d_model: int, fail: Fail) -> None:
        """The section's rules across its fields (config.rules calls this for the chosen backbone)."""

    @abstractmethod
    def build_layer(self, cfg: Any, index: int, device=None, dtype=None) -> Any:
        """Block `index` of the stack, an nn.Module with the backbone contract (models.backbone)."""

    @abstractmethod
    def init_weights_(self, backbone: Any, cfg: Any) -> None:
        """The backbone's reference initialisation, in place (the embedding is the language model's)."""

    def attention_flops(self, cfg: Any, seq_len: int) -> float:
        """Forward FLOPs per token of one pass beyond 2 per weight (attention scores and values)."""
        return 0.0

    @abstractmethod
    def from_transformers(self, hf: dict) -> tuple[list[str], dict[str, str]] | None:
        """For a transformers (or mamba_ssm) folder's config.json of this backbone: our config
        overrides and the renaming of its tensors' top-level prefixes; None when it is not one."""

    def transformers_fields(self, cfg: Any) -> dict:
        """What an export's config.json says of this backbone for transformers and tools on it."""
        return {}

    @abstractmethod
    def released_vocab(self, hf: dict) -> int:
        """The vocabulary of a released config.json."""

    @abstractmethod
    def released_vocab_fields(self, vocab: int) -> dict:
        """... and how the released code's config.json of this backbone states it."""

    @abstractmethod
    def released_overrides(self, block: dict, backbone: dict, d_inner: int, refuse: Refuse,
                           warn: Callable[[str], None]) -> list[str]:
        """Our overrides for a released config's block settings (`block_cfg`), popping what they read
        from `block` and `backbone` (what is left is refused as unknown); `warn` says what is not applied."""

    @abstractmethod
    def released_block(self, cfg: Any) -> tuple[dict, dict]:
        """The released config's `block_cfg` and `backbone_config` entries for our model config (the
        inverse of released_overrides)."""

    @abstractmethod
    def kernels_in_use(self, probe: Any) -> str:
        """Which implementation a forward on a tensor like `probe` takes (fused kernels or PyTorch)."""
