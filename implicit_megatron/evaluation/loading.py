"""A model ready for evaluation from either kind of folder a run produces.

A checkpoint folder (a run's `checkpoints/`, any ZeRO stage) is consolidated through
`read_checkpoint`; an exported folder (model.safetensors + config.json) through `from_pretrained`,
which reads it through the export reader (hf/export_reader.py) first.
Both give the same LanguageModel in eval mode, with weight normalisation folded away and the
solver set to the curriculum phase the weights were trained in (see `phases.resolve_solver`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from implicit_megatron.config import Config
from implicit_megatron.evaluation.phases import SolverChoice, apply_solver, resolve_solver
from implicit_megatron.models.lm import LanguageModel

if TYPE_CHECKING:
    from data_pipeline.tokenizer import Tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]


class NotAModelError(ValueError):
    """The path is neither a checkpoint folder nor an exported folder."""


@dataclass
class LoadedModel:
    """What every task needs: the model, its run config, its tokenizer and where it came from."""

    model: LanguageModel
    cfg: Config
    tokenizer: Tokenizer
    source: str
    kind: str  # "checkpoint" or "export"
    tag: str | None = None
    solver: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The model's row name in the tables: run name and (s+k)."""
        return f"{self.cfg.name} {self.solver.get('label', '')}".strip()


def classify(path: str | Path) -> tuple[str, Path, str | None]:
    """("checkpoint", checkpoints folder, tag) or ("export", folder, None); NotAModelError otherwise."""
    from implicit_megatron.checkpoints.layout import LATEST, MODEL_STATES, ZERO3_MODEL_STATES
    from implicit_megatron.hf.export_reader import CONFIG_FILE, MODEL_FILE

    folder = Path(path)
    if not folder.exists():
        raise NotAModelError(f"{folder}: no such file or directory")
    if folder.is_dir() and all(os.path.lexists(folder / name) for name in (CONFIG_FILE, MODEL_FILE)):
        return "export", folder, None  # whatever kind of file each is: the export's reader says what is wrong
    if folder.is_dir() and (folder / LATEST).is_file():
        return "checkpoint", folder, None
    if folder.is_dir() and (folder / "checkpoints" / LATEST).is_file():  # a run folder
        return "checkpoint", folder / "checkpoints", None
    if folder.is_dir() and any((folder / name).is_file() for name in (MODEL_STATES, ZERO3_MODEL_STATES)):
        return "checkpoint", folder.parent, folder.name  # one tag of a checkpoints folder
    raise NotAModelError(f"{folder}: neither a checkpoint folder (a run's checkpoints/ with a 'latest' file) "
                         f"nor an exported folder ({CONFIG_FILE} + {MODEL_FILE} from tools/convert_checkpoint.py)")


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               choice: SolverChoice | None = None) -> LoadedModel:
    """Load for evaluation; `choice` overrides the phase, pass cap or tolerance of the solver."""
    from implicit_megatron.builder import build_model, remove_weight_norm
    from implicit_megatron.checkpoints.layout import phase_of, read_latest
    from implicit_megatron.hf.export import from_pretrained, read_checkpoint, read_folder_config

    kind, folder, tag = classify(path)
    if kind == "export":
        cfg = read_folder_config(folder)
        model = from_pretrained(folder)
        tag_phase = None
    else:
        tag = tag or read_latest(folder)
        state, cfg = read_checkpoint(folder, tag)
        model = build_model(cfg)
        model.load_state_dict(state, strict=True)
        remove_weight_norm(model)
        tag_phase = phase_of(tag or "")
    model = model.to(device=device, dtype=dtype).eval()
    settings = resolve_solver(cfg, tag_phase, choice or SolverChoice())
    apply_solver(model, settings)
    tokenizer = load_run_tokenizer(cfg, folder if kind == "export" else None)
    return LoadedModel(model, cfg, tokenizer, str(path), kind, tag, settings)


def load_run_tokenizer(cfg: Config, export_folder: Path | None = None):
    """The run's tokenizer: the copy inside an export, else data.tokenizer (from here or the repository);
    refused where its ids go past a language model's vocabulary."""
    from data_pipeline.tokenizer import load_tokenizer

    named = Path(cfg.data.tokenizer)
    # a sentencepiece export holds tokenizer.model (the run's own) and its conversion, tokenizer.json
    candidates = ([export_folder / n for n in ("tokenizer.model", "tokenizer.json", named.name)]
                  if export_folder is not None else [])
    candidates += [named, REPO_ROOT / named]
    for candidate in candidates:
        if candidate.exists():
            tokenizer = load_tokenizer(candidate)
            # its ids would index past the embedding (a word problem's model reads no text: no tokenizer ids)
            if cfg.task.kind == "language_model" and tokenizer.vocab_size > cfg.model.vocab_size:
                raise ValueError(f"{candidate}: token ids up to {tokenizer.vocab_size - 1}, past the model's "
                                 f"vocabulary of {cfg.model.vocab_size} (model.vocab_size): not this model's "
                                 "tokenizer, or a damaged one")
            return tokenizer
    raise FileNotFoundError(f"tokenizer {cfg.data.tokenizer} not found (looked in "
                            f"{', '.join(str(c) for c in candidates)})")
