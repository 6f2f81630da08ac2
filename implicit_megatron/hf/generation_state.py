"""The sequential-mode state as transformers' `generate` carries it between forwards.

`generate` keeps whatever a forward returns as its state (`cache`; `past_key_values` before
transformers 5.24) and hands it to the next one.
For our models that is the committed per-layer state of sequential mode (Mamba2: conv and SSM
states; Llama: the KV cache), so each new token is one solved step under that state, as in
`evaluation.generation`, instead of the whole prefix run again: the cost of a token does not
grow with the prefix for Mamba2, and grows only by the attention over it for Llama.

It is not a transformers `Cache`: those hold keys and values that transformers' own attention
updates, while ours is stepped by our backbone. It has what `generate` asks of a cache
(`get_seq_length`, `reorder_cache` for beam search, `is_compileable`, `is_croppable`, `is_linear`).
"""

from __future__ import annotations

import dataclasses

import torch

from implicit_megatron.models.backbone import BackboneState, LayerState
from implicit_megatron.models.llama import KVCache
from implicit_megatron.models.lm import LanguageModel


class SequentialState:
    """The committed backbone state after `length` tokens of each row; updated in place by `advance`."""

    is_compileable = False  # generate must not compile the forward around it
    is_croppable = False  # a recurrent state cannot be rolled back (no assisted generation)

    def __init__(self, state: BackboneState, length: int) -> None:
        self.state = state
        self.length = length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens the state holds: `generate` feeds only the ones after them."""
        return self.length

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether its state has a constant size (Mamba2) rather than growing (Llama's KV
        cache); transformers >= 5.24 asks before it restarts from a returned state."""
        return [not isinstance(layer, KVCache) for layer in self.state]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i of the state becomes row beam_idx[i]."""
        self.state = tuple(_select_rows(layer, beam_idx) for layer in self.state)

    @torch.no_grad()
    def advance(self, model: LanguageModel, input_ids: torch.Tensor) -> torch.Tensor:
        """Run `input_ids` (B, T) after the held tokens in sequential mode; returns z (B, T, d)."""
        self.state = with_room(self.state, self.length + input_ids.shape[1])
        z, self.state, _ = model.core.forward_sequential(model.embedding(input_ids), self.state)
        self.length += input_ids.shape[1]
        return z

    @classmethod
    @torch.no_grad()
    def start(cls, model: LanguageModel, input_ids: torch.Tensor) -> tuple[torch.Tensor, SequentialState]:
        """A fresh state after the prompt `input_ids` (B, T): z (B, T, d) and the state."""
        z, state, _ = model.core.forward_sequential(model.embedding(input_ids), None)
        return z, cls(state, input_ids.shape[1])


def with_room(state: BackboneState, tokens: int) -> BackboneState:
    """The state with room for `tokens` tokens (Llama's KV caches grow, `KVCache.with_room`; Mamba2
    states have a constant size and are returned as they are)."""
    return tuple(layer.with_room(tokens) if isinstance(layer, KVCache) else layer for layer in state)


def _select_rows(layer: LayerState, rows: torch.Tensor) -> LayerState:
    """Every batch-first tensor of a layer's state (Mamba2State or KVCache) indexed by `rows`."""
    changes = {f.name: getattr(layer, f.name).index_select(0, rows.to(getattr(layer, f.name).device))
               for f in dataclasses.fields(layer) if isinstance(getattr(layer, f.name), torch.Tensor)}
    return dataclasses.replace(layer, **changes)


def refuse_padding(attention_mask: torch.Tensor | None) -> None:
    """A mask of ones changes nothing; zeros (padded prompts) are refused: left padding would enter
    the recurrent state and shift Llama's positions, and right padding would be continued."""
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError("attention_mask: padding (zeros in the mask) is not supported; the models carry a "
                         "recurrent state that padded tokens would enter. Generate prompts of one length "
                         "together, or one prompt at a time")
