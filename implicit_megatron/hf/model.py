"""Our model behind transformers' Auto classes, for exported folders.

Registered with them when the package is imported (hf/auto.py), so that after `import implicit_megatron`

    AutoModelForCausalLM.from_pretrained(folder)

builds the same LanguageModel that `implicit_megatron.from_pretrained` builds, without running any
code of the folder. An exported folder also names these classes in config.json's `auto_map`,
through its `modeling_implicit_megatron.py` and its own copy of this module and what it imports
(hf/remote_code.py), for `trust_remote_code=True` in a Python without the package. The wrapper
registers the LanguageModel's own submodules, so the state-dict keys are those of model.safetensors.

A plain forward is the LanguageModel's (simultaneous mode: the whole sequence solved at once).
`generate` runs sequential mode instead, as tools/generate.py does: the prompt token by token,
then each new token as one solved step under the carried state (`generation_state.SequentialState`,
returned as the output's `cache`, `past_key_values` before transformers 5.24: both names are
read and written here), never the prefix again. `use_cache=False` runs the whole prefix
in simultaneous mode for every token; for explicit models both give the same tokens, for implicit
ones they agree as far as both solves converge to the same fixed point (within their tolerance).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from implicit_megatron.hf.config import ImplicitMegatronConfig

# where an output carries the state: `cache` from transformers 5.24 on, `past_key_values` before
STATE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class ImplicitMegatronForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = ImplicitMegatronConfig
    base_model_prefix = "implicit_megatron"
    _no_split_modules = []
    _tied_weights_keys = {}  # a tied head reads embedding.weight; it has no weight of its own
    _is_stateful = True  # the state cannot be rolled back: generate refuses assisted decoding

    def __init__(self, config: ImplicitMegatronConfig):
        super().__init__(config)
        from implicit_megatron.builder import build_model
        from implicit_megatron.config.saved import checked_eval_stop
        from implicit_megatron.hf.export_reader import checked_run_config

        cfg = checked_run_config(config.implicit_megatron, "config.json")  # a config from the Hub, or made here
        cfg.implicit.eval_stop = checked_eval_stop(config.eval_stop, "config.json")
        lm = build_model(cfg)
        for name, child in lm.named_children():
            self.add_module(name, child)
        self._language_model = (lm,)  # a tuple: not registered twice as a submodule
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' load of a folder that our reader read first (hf/export_reader.py: config.json
        through the config's rules, the weights' header against it), then the weights refused where
        one is not finite (as every reader of ours). A name that is no folder here (a Hub repository)
        is read by transformers, and its config checked as the model is built (`__init__`)."""
        from implicit_megatron.checkpoints.weights_file import refuse_nonfinite
        from implicit_megatron.hf.export_reader import MODEL_FILE, check_export_weights, read_export_config

        folder = Path(str(pretrained_model_name_or_path)) / (kwargs.get("subfolder") or "")
        if folder.is_dir():
            export = read_export_config(folder)
            if (folder / MODEL_FILE).exists() or (folder / MODEL_FILE).is_symlink():  # else sharded: transformers'
                check_export_weights(export)
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        refuse_nonfinite(model.state_dict(), folder / MODEL_FILE)
        return model

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """transformers' save, with the code that exports carry (hf/remote_code.py) instead of this
        module alone, which imports the rest of the package: the folder loads as an export."""
        from implicit_megatron.hf.remote_code import AUTO_MAP, write_remote_code

        classes = (type(self), type(self.config))
        own = {cls: cls.__dict__["_auto_class"] for cls in classes if "_auto_class" in cls.__dict__}
        self.config.auto_map = dict(AUTO_MAP)
        for cls in classes:  # transformers copies the defining module of an Auto class (set on the class)
            cls._auto_class = None
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            for cls in classes:
                if cls in own:
                    cls._auto_class = own[cls]
                else:
                    del cls._auto_class
        write_remote_code(Path(save_directory))

    def _init_weights(self, module) -> None:
        """Our modules initialise themselves; loading overwrites every tensor anyway."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate must not make a transformers DynamicCache: our forward makes its own state."""
        return False

    def get_input_embeddings(self):
        return self.embedding

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None,
                past_key_values=None, use_cache: bool | None = None, labels: torch.Tensor | None = None,
                logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """Logits of `input_ids` (B, T). With a state (`cache`, or its older name `past_key_values`:
        the SequentialState an earlier forward returned) or `use_cache`,
        in sequential mode after the tokens the state holds, returning the state advanced; else in
        simultaneous mode. Sequential mode is for inference: it runs without gradient.
        `attention_mask` (B, T), or (B, held + T) with a state: 0 at padding, on either side or
        between a prompt and its continuation; padding enters no row's state, and a row's logits are
        those of its real tokens alone (a padded position repeats the row's last real one).
        `logits_to_keep` > 0: logits of the last that many tokens only."""
        from implicit_megatron.hf.generation_state import SequentialState
        from implicit_megatron.models.padding import has_padding, padded_core

        lm = self._language_model[0]
        mask = None if attention_mask is None else attention_mask[:, -input_ids.shape[1]:]
        past_key_values = cache if cache is not None else past_key_values
        if past_key_values is not None and not isinstance(past_key_values, SequentialState):
            raise TypeError(f"cache: expected the SequentialState an earlier forward returned, got "
                            f"{type(past_key_values).__name__}")
        if past_key_values is not None:
            z = past_key_values.advance(lm, input_ids, mask)
        elif use_cache:
            z, past_key_values = SequentialState.start(lm, input_ids, mask)
        else:
            x = lm.embedding_dropout(lm.embedding(input_ids))
            z = padded_core(lm.core, x, mask) if has_padding(mask) else lm.core(x)
        logits = lm.logits(z[:, -logits_to_keep:] if logits_to_keep else z)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                     labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{STATE_FIELD: past_key_values})

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, cache=None, past_key_values=None,
                                      attention_mask: torch.Tensor | None = None, use_cache: bool | None = None,
                                      **kwargs) -> dict:
        """With a state, only the tokens it has not seen (the new one); without, the whole prefix."""
        state = cache if cache is not None else past_key_values
        if state is not None:
            input_ids = input_ids[:, state.get_seq_length():]
        return {"input_ids": input_ids, "cache": state, "attention_mask": attention_mask, "use_cache": use_cache}


__all__ = ["STATE_FIELD", "ImplicitMegatronConfig", "ImplicitMegatronForCausalLM"]
