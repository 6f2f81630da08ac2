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
from implicit_megatron.models.lm import LanguageModel


class SequentialState:
    """The committed backbone state after `length` tokens of each row (padding included: positions
    of the batch, not of a row's real tokens); updated in place by `advance`. `last` (B, d) is each
    row's last real z, where a warm start begins and what padding repeats (core.forward_sequential)."""

    is_compileable = False  # generate must not compile the forward around it
    is_croppable = False  # a recurrent state cannot be rolled back (no assisted generation)

    def __init__(self, state: BackboneState, length: int, last: torch.Tensor | None = None) -> None:
        self.state = state
        self.length = length
        self.last = last

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens the state holds: `generate` feeds only the ones after them."""
        return self.length

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether its state has a constant size (Mamba2) rather than growing (Llama's KV
        cache); transformers >= 5.24 asks before it restarts from a returned state."""
        return [not layer.grows for layer in self.state]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i of the state becomes row beam_idx[i]."""
        self.state = tuple(_select_rows(layer, beam_idx) for layer in self.state)
        if self.last is not None:
            self.last = self.last.index_select(0, beam_idx.to(self.last.device))

    @torch.no_grad()
    def advance(self, model: LanguageModel, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run `input_ids` (B, T) after the held tokens in sequential mode; returns z (B, T, d).
        `attention_mask` (B, T): 0 where a token is padding, which no row's state takes in."""
        self.state = with_room(self.state, self.length + input_ids.shape[1])
        z, self.state, _ = model.core.forward_sequential(model.embedding(input_ids), self.state,
                                                         mask=attention_mask, last=self.last)
        self.length += input_ids.shape[1]
        self.last = z[:, -1]
        return z

    @classmethod
    @torch.no_grad()
    def start(cls, model: LanguageModel, input_ids: torch.Tensor,
              attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, SequentialState]:
        """A fresh state after the prompt `input_ids` (B, T), padded where `attention_mask` is 0:
        z (B, T, d) and the state."""
        z, state, _ = model.core.forward_sequential(model.embedding(input_ids), None, mask=attention_mask)
        return z, cls(state, input_ids.shape[1], z[:, -1])


def with_room(state: BackboneState, tokens: int) -> BackboneState:
    """The state with room for `tokens` tokens (Llama's KV caches grow, `KVCache.with_room`; Mamba2
    states have a constant size and are returned as they are)."""
    return tuple(layer.with_room(tokens) for layer in state)


def _select_rows(layer: LayerState, rows: torch.Tensor) -> LayerState:
    """Every batch-first tensor of a layer's state (Mamba2State or KVCache) indexed by `rows`."""
    changes = {f.name: getattr(layer, f.name).index_select(0, rows.to(getattr(layer, f.name).device))
               for f in dataclasses.fields(layer) if isinstance(getattr(layer, f.name), torch.Tensor)}
    return dataclasses.replace(layer, **changes)


def refuse_padding(attention_mask: torch.Tensor | None) -> None:
    """What folders exported before padded batches were supported call (their modeling file holds
    the wrapper of that time): a mask of ones changes nothing; zeros are refused."""
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError("attention_mask: padding (zeros in the mask) is not supported; the models carry a "
                         "recurrent state that padded tokens would enter. Generate prompts of one length "
                         "together, or one prompt at a time")
