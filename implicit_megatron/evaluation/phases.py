"""Which (s+k) solver settings to evaluate with.

The run config's `implicit` section holds the first phase; the trainer switches phases on the
core only. So the weights of `free-step200` must be evaluated with the free phase's (24+4) and
tolerance, not with the config's (4+1). A checkpoint names its phase in its tag; an export does
not, and is taken to be the end of its run (the last phase). A bounded phase is evaluated as the
released (4+1) models are: stopping at implicit.eval_tol (0.05) within eval_factor x max_iter
passes, unless the fixed-depth view is asked for. Explicit options override either.
"""

from __future__ import annotations

from dataclasses import dataclass

from implicit_megatron.config import Config, PhaseConfig
from implicit_megatron.config.schema import EVAL_STOPS
from implicit_megatron.models.lm import LanguageModel


@dataclass
class SolverChoice:
    """Overrides from the command line; None keeps what the run implies."""

    phase: str | None = None  # a curriculum phase by name
    max_iter: int | None = None  # cap on passes per forward in evaluation (replaces max_iter x eval_factor)
    tol: float | None = None  # stopping tolerance of the relative residual
    fixed_depth: bool = False  # a bounded phase at exactly its max_iter passes, not stopping at eval_tol
    # token: each position stops at its own residual, so no score moves with the batch, its padding or
    # what follows; sequence: each sequence at its own; batch: the released code's one stop test over
    # the batch (paper fidelity), named, never by default
    eval_stop: str = "token"


def find_phase(cfg: Config, name: str) -> PhaseConfig:
    for phase in cfg.curriculum.phases:
        if phase.name == name:
            return phase
    names = ", ".join(p.name for p in cfg.curriculum.phases) or "none"
    raise ValueError(f"phase {name!r} is not in the run's curriculum (phases: {names})")


def resolve_solver(cfg: Config, tag_phase: str | None, choice: SolverChoice) -> dict:
    """A plain dict (it goes into results.json): phase, max_iter, phantom_steps, tol, cap, label."""
    im = cfg.implicit
    if choice.eval_stop not in EVAL_STOPS:
        raise ValueError(f"eval_stop must be one of {', '.join(EVAL_STOPS)}, not {choice.eval_stop!r}")
    if not im.enabled:
        return {"implicit": False, "phase": None, "max_iter": 1, "phantom_steps": 0, "tol": None, "cap": 1,
                "label": "(explicit)"}
    name = choice.phase or tag_phase or (cfg.curriculum.phases[-1].name if cfg.curriculum.phases else None)
    phase = find_phase(cfg, name) if name and cfg.curriculum.phases else None
    if choice.phase and phase is None:
        raise ValueError(f"phase {choice.phase!r} is not in the run's curriculum (it has none)")
    s, k, tol = (phase.max_iter, phase.phantom_steps, phase.tol) if phase else (im.max_iter, im.phantom_steps, im.tol)
    if choice.tol is not None:
        tol = choice.tol
    elif tol is None and not choice.fixed_depth:  # a bounded phase stops at its evaluation tolerance
        tol = im.eval_tol
    cap = choice.max_iter or (s * im.eval_factor if tol is not None else s)
    return {"implicit": True, "phase": phase.name if phase else None, "max_iter": s, "phantom_steps": k, "tol": tol,
            "cap": cap, "damping": im.damping, "eval_stop": choice.eval_stop, "label": f"({s}+{k})"}


def apply_solver(model: LanguageModel, settings: dict) -> None:
    """Set the core so that evaluation runs at most `cap` passes, stopping early at `tol` (each
    sequence at its own residual unless the batch-wide stop was named)."""
    if settings["implicit"]:
        model.core.set_phase(max_iter=settings["cap"], eval_factor=1, tol=settings["tol"], eval_tol=None,
                             phantom_steps=settings["phantom_steps"], eval_stop=settings["eval_stop"])
