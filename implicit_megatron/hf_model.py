"""Our model behind transformers' Auto classes, for exported folders (`trust_remote_code=True`).

`export` copies this file into the folder as `modeling_implicit_megatron.py` and names its two
classes in config.json's `auto_map`, so that

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

builds the same LanguageModel that `implicit_megatron.from_pretrained` builds (the package must
be installed). The wrapper registers the LanguageModel's own submodules, so the state-dict keys
are those of model.safetensors, and forward is the LanguageModel's forward.
"""

from __future__ import annotations

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class ImplicitMegatronConfig(PretrainedConfig):
    """Holds our run config (the `implicit_megatron` entry) next to the few fields transformers reads."""

    model_type = "implicit_megatron"

    def __init__(self, implicit_megatron: dict | None = None, **kwargs):
        self.implicit_megatron = implicit_megatron or {}
        model = self.implicit_megatron.get("model", {})
        kwargs.setdefault("vocab_size", model.get("vocab_size"))
        kwargs.setdefault("hidden_size", model.get("d_model"))
        kwargs.setdefault("num_hidden_layers", model.get("n_layers"))
        kwargs.setdefault("tie_word_embeddings", model.get("tie_embeddings", True))
        super().__init__(**kwargs)


class ImplicitMegatronForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = ImplicitMegatronConfig
    base_model_prefix = "implicit_megatron"
    _no_split_modules = []
    _tied_weights_keys = {}  # a tied head reads embedding.weight; it has no weight of its own

    def __init__(self, config: ImplicitMegatronConfig):
        super().__init__(config)
        from implicit_megatron.builder import build_model
        from implicit_megatron.export import config_from_dict

        lm = build_model(config_from_dict(config.implicit_megatron, "config.json"))
        for name, child in lm.named_children():
            self.add_module(name, child)
        self._language_model = (lm,)  # a tuple: not registered twice as a submodule
        self.post_init()

    def _init_weights(self, module) -> None:
        """Our modules initialise themselves; loading overwrites every tensor anyway."""

    def get_input_embeddings(self):
        return self.embedding

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        logits = self._language_model[0](input_ids)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                     labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs) -> dict:
        return {"input_ids": input_ids}  # no cache: the whole prefix is run again (simultaneous mode)
