"""A run folder's curves against tokens, for plotting (tools/plot_run.py): every metric of
`metrics.jsonl` as (tokens, value) points, and the curriculum's phases as token spans.

A step may have several records: the training interval's and a validation's, and, where a resumed
launch trained steps again, those of the earlier launch (the trainer drops them on resume, but a
copied or hand-merged file may still hold them). The step's record is all of them merged in file
order, so the last value of each metric wins. Tokens are step x train.global_batch_size x
data.seq_len of the run's `config.yaml`, the config its last launch trained with. The phases are
the step ranges the run trained them over, as its newest checkpoint records them (a run extended
past its first train.steps keeps its phases where they were); a run without checkpoints gets its
config's fractions of train.steps (implicit_megatron.config.phase_bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from implicit_megatron.config import Config, phase_bounds, read_config
from implicit_megatron.tracking.metrics_file import METRICS_FILE, read_metrics

CONFIG_FILE = "config.yaml"


class NotARunError(ValueError):
    """A folder that lacks what a run writes (metrics.jsonl, config.yaml)."""


@dataclass
class PhaseSpan:
    name: str
    kind: str  # bounded | free | unrolled
    label: str  # "(4+1)", "(24+4), tol 0.05", "4 unrolled"
    first_step: int
    end_step: int  # exclusive
    start_tokens: int
    end_tokens: int


@dataclass
class RunCurves:
    name: str  # the run's config name
    folder: Path
    tokens_per_step: int
    steps: list[int] = field(default_factory=list)  # every logged step, ascending
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)  # key -> (tokens, values)
    phases: list[PhaseSpan] = field(default_factory=list)

    def has(self, key: str) -> bool:
        return bool(self.series.get(key, ((), ()))[0])


def last_record_per_step(records: list[dict]) -> dict[int, dict]:
    """step -> that step's records merged in file order (later values win), steps ascending."""
    merged: dict[int, dict] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int):
            merged.setdefault(step, {}).update(record)
    return dict(sorted(merged.items()))


def recorded_phase_ranges(folder: Path) -> list[tuple[str, int, int]] | None:
    """(phase, first step, end step) as the run's newest checkpoint records them; None without one."""
    from implicit_megatron.checkpoints.layout import DamagedCheckpoint, read_client_state, read_latest

    checkpoints = folder / "checkpoints"
    try:
        tag = read_latest(checkpoints) if checkpoints.is_dir() else None
        ranges = read_client_state(checkpoints / tag).get("phase_bounds") if tag else None
    except (DamagedCheckpoint, OSError, ValueError, RuntimeError):
        return None  # a checkpoint that cannot be read: the config's fractions instead
    return [(str(name), int(start), int(end)) for name, start, end in ranges] if ranges else None


def phase_spans(cfg: Config, ranges: list[tuple[str, int, int]] | None = None) -> list[PhaseSpan]:
    """The curriculum's phases with their steps and tokens (none for a run without phases): over the
    recorded `ranges` where given, else over the config's fractions of train.steps."""
    per_step = tokens_per_step(cfg)
    phases = {phase.name: phase for phase in cfg.curriculum.phases}
    bounds = phase_bounds(cfg) if ranges is None else [(phases[name], start, end) for name, start, end in ranges
                                                        if name in phases]
    spans = []
    for phase, start, end in bounds:
        if phase.kind == "unrolled":
            label = f"{phase.max_iter} unrolled"
        else:
            label = f"({phase.max_iter}+{phase.phantom_steps})" + (f", tol {phase.tol:g}" if phase.tol else "")
        spans.append(PhaseSpan(phase.name, phase.kind, label, start, end, start * per_step, end * per_step))
    return spans


def tokens_per_step(cfg: Config) -> int:
    return cfg.train.global_batch_size * cfg.data.seq_len


def read_run(folder: str | Path) -> RunCurves:
    """The curves of one run folder; NotARunError names what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotARunError(f"{folder}: no such folder (give a run's output folder, train.output_dir)")
    if not (folder / METRICS_FILE).is_file():
        raise NotARunError(f"{folder / METRICS_FILE}: not found; {folder} is not a run's output folder, or its "
                           "run has not logged a step yet")
    if not (folder / CONFIG_FILE).is_file():
        raise NotARunError(f"{folder / CONFIG_FILE}: not found (the trainer writes it beside metrics.jsonl); "
                           "without it the tokens per step are unknown")
    cfg = read_config(folder / CONFIG_FILE)
    per_step = tokens_per_step(cfg)
    by_step = last_record_per_step(read_metrics(folder))
    series: dict[str, tuple[list[int], list[float]]] = {}
    for step, record in by_step.items():
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                tokens, values = series.setdefault(key, ([], []))
                tokens.append(step * per_step)
                values.append(float(value))
    return RunCurves(cfg.name, folder, per_step, list(by_step), series, phase_spans(cfg, recorded_phase_ranges(folder)))
