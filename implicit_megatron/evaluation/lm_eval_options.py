"""What an lm-evaluation-harness run is asked for: its tasks, where they come from, the backend."""

from __future__ import annotations

from dataclasses import dataclass, field

PAPER_TASKS = ("lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande", "openbookqa")


@dataclass
class LmEvalOptions:
    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))
    include_path: str | None = None  # a folder of local task YAMLs
    include_defaults: bool | None = None  # None: only when no include_path is given
    backend: str = "implicit_megatron"  # or "hf" (an exported folder through transformers)
    batch_size: int = 8
    max_length: int | None = None  # None: the run's training length
    limit: int | None = None  # documents per task
    num_fewshot: int | None = None
    mode: str = "simultaneous"  # how our adapter scores
