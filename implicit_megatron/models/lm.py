"""LanguageModel: embedding -> core -> head tied to the embedding.

The core maps embedded tokens x (B, T, d) to final, normalised states z (B, T, d): the
`ImplicitCore` (implicit_megatron.implicit.core) iterates the Backbone to a fixed point, or applies
it once to z0 = x for the explicit baseline. The model only knows `core(x) -> z` and `core.backbone`;
`implicit_megatron.build_model(cfg)` composes the two.

Logits cover the padded vocabulary (padded_vocab_size columns, e.g. 50288 for 50277 tokens): the
padding rows are ordinary embedding rows that no target ever uses, as in mamba_ssm and Megatron;
samplers should mask ids >= `vocab_size`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from implicit_megatron.config import ModelConfig
from implicit_megatron.models.backbone import Backbone
from implicit_megatron.models.loss import linear_cross_entropy
from implicit_megatron.models.padding import has_padding, padded_core

if TYPE_CHECKING:
    from implicit_megatron.implicit.core import ImplicitCore
    from implicit_megatron.implicit.iteration import SolverStats


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig, core: ImplicitCore, device=None, dtype=None) -> None:
        super().__init__()
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.padded_vocab_size = cfg.padded_vocab_size
        self.embedding = nn.Embedding(cfg.padded_vocab_size, cfg.d_model, device=device, dtype=dtype)
        self.embedding_dropout = nn.Dropout(cfg.embedding_dropout)  # on x, before the core (released models)
        self.core = core
        self.lm_head = None
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.padded_vocab_size, bias=False, device=device, dtype=dtype)
        with torch.no_grad():  # the backbone initialised itself; the core's other modules are the core's
            nn.init.normal_(self.embedding.weight, mean=0.0, std=cfg.init_std)
            if self.lm_head is not None:
                nn.init.normal_(self.lm_head.weight, mean=0.0, std=cfg.init_std)

    @property
    def backbone(self) -> Backbone:
        """The core's backbone, for tools that need layer access."""
        return cast(Backbone, self.core.backbone)  # the core holds any module of the backbone's contract

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.lm_head is None else self.lm_head.weight

    def solver_stats(self) -> SolverStats | None:
        """What the last forward's solve did (passes, residual and convergence per sample), for the
        trainer's metrics and the evaluation tools; None for the explicit model."""
        return self.core.last_stats

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Final states (..., d) -> logits (..., padded_vocab_size)."""
        return z @ self.head_weight.t()

    def forward(self, input_ids: torch.Tensor, seq_idx: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, padded_vocab_size); seq_idx (B, T) separates packed documents;
        attention_mask (B, T) is 0 at padding (prompts of different lengths, see models.padding).

        With labels (B, T) it returns the mean cross-entropy instead, computed chunk by chunk so that
        the logits of the whole batch never exist (models.loss; labels of -100 are ignored).
        """
        x = self.embedding_dropout(self.embedding(input_ids))
        if has_padding(attention_mask):
            if seq_idx is not None:
                raise ValueError("attention_mask with padding and seq_idx (packed documents): pass one of them")
            z = padded_core(self.core, x, attention_mask)
        else:
            z = self.core(x) if seq_idx is None else self.core(x, seq_idx=seq_idx)
        if labels is not None:
            return linear_cross_entropy(z, self.head_weight, labels)
        return self.logits(z)

    def num_parameters(self, exclude_embedding: bool = False) -> int:
        """Distinct parameters (a tied head counts once); without the embedding and untied head if asked."""
        skip = set()
        if exclude_embedding:
            skip.add(id(self.embedding.weight))
            if self.lm_head is not None:
                skip.add(id(self.lm_head.weight))
        seen = {id(p): p for p in self.parameters() if id(p) not in skip}
        return sum(p.numel() for p in seen.values())


def seq_idx_from_eod(input_ids: torch.Tensor, eod_id: int) -> torch.Tensor:
    """(B, T) int32 document ids for packed samples: an EOD token belongs to the document it ends."""
    is_eod = (input_ids == eod_id).to(torch.int32)
    return (torch.cumsum(is_eod, dim=1) - is_eod).to(torch.int32)
