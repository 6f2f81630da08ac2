"""The transformers config of an exported folder: our run config beside the fields transformers reads.

Its own module, importing only transformers' config base: it is registered with AutoConfig when
transformers' auto module is imported (hf/auto.py), and the model's heavier imports must not run then.
"""

from __future__ import annotations

from transformers.configuration_utils import PretrainedConfig

FIRST_USE: list = []  # called once, when the first of these configs is made (hf/auto.py fills it)


class ImplicitMegatronConfig(PretrainedConfig):
    """Holds our run config (the `implicit_megatron` entry) next to the few fields transformers reads.

    `eval_stop` is how a forward outside training stops the solver: "token" (each position at its own
    residual, so a row's result is the one it gets alone, whatever shares its batch or pads it,
    with or without an attention mask) unless a client names "sequence" (each row at its own) or
    "batch", the released code's one stop test over the batch, for paper-fidelity evaluation:
    `from_pretrained(folder, eval_stop="batch")`, or lm-eval's `--model_args ...,eval_stop=batch`.
    """

    model_type = "implicit_megatron"

    def __init__(self, implicit_megatron: dict | None = None, eval_stop: str = "token", **kwargs):
        self.implicit_megatron = implicit_megatron or {}
        self.eval_stop = eval_stop
        model = self.implicit_megatron.get("model", {})
        vocab, multiple = model.get("vocab_size"), model.get("pad_vocab_multiple", 1)
        # the width of the logits, padding rows included, as transformers' own models count it (beam search does);
        # sizes that are no positive integers are left to the export's reader to refuse by name (hf/export_reader.py)
        sizes = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (vocab, multiple))
        kwargs.setdefault("vocab_size", -(-vocab // multiple) * multiple if sizes else None)
        kwargs.setdefault("hidden_size", model.get("d_model"))
        kwargs.setdefault("num_hidden_layers", model.get("n_layers"))
        kwargs.setdefault("tie_word_embeddings", model.get("tie_embeddings", True))
        super().__init__(**kwargs)
        while FIRST_USE:  # AutoModelForCausalLM reads this config next: hf/auto.py registers the model now
            FIRST_USE.pop()()
