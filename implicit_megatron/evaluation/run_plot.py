"""tools/plot_run.py's one home: a run folder's curves against tokens, and the PNG drawn from them.

Reading (`read_run`): every metric of `metrics.jsonl` as (tokens, value) points, and the
curriculum's phases as token spans. A step may have several records: the training interval's and a
validation's, and, where a resumed launch trained steps again, those of the earlier launch (the
trainer drops them on resume, but a copied or hand-merged file may still hold them). The step's
record is all of them merged in file order, so the last value of each metric wins. Tokens are step
x train.global_batch_size x data.seq_len of the run's `config.yaml`, the config its last launch
trained with. The phases are the step ranges the run trained them over, as its newest checkpoint
records them (a run extended past its first train.steps keeps its phases where they were); a run
without checkpoints gets its config's fractions of train.steps (implicit_megatron.config.phase_bounds).

Drawing (`plot`): one or more runs' curves in one PNG (loss, perplexity, learning rate, solver
passes and residual, and accuracy or the gradient norm), the curriculum's phases shaded (several
runs: each its own strip along the panels' foot, so that their phases never overlap), and where each
launch began (launches.jsonl: a first start, a resume, a curriculum's next phase, an extension)
marked at the panels' top in its run's colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from implicit_megatron.config import Config, phase_bounds, read_config
from implicit_megatron.tracking.launches_file import read_launches
from implicit_megatron.tracking.metrics_file import METRICS_FILE, read_metrics

if TYPE_CHECKING:
    from matplotlib.artist import Artist

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
    launches: list[tuple[int, str]] = field(default_factory=list)  # (tokens, start | resume) of each launch

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
    from implicit_megatron.config.plan import recorded_bounds

    checkpoints = folder / "checkpoints"
    try:
        tag = read_latest(checkpoints) if checkpoints.is_dir() else None
        ranges = recorded_bounds(read_client_state(checkpoints / tag)) if tag else None
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
    launches = list(dict.fromkeys((launch.step * per_step, launch.kind) for launch in read_launches(folder)))
    return RunCurves(cfg.name, folder, per_step, list(by_step), series, phase_spans(cfg, recorded_phase_ranges(folder)),
                     launches)


# phases are shaded in hues no run line takes (runs are drawn in matplotlib's C0, C1, ...: tab:blue, tab:orange, ...)
PHASE_COLOURS = ["khaki", "lightsteelblue", "thistle", "darkseagreen", "lightsalmon", "lightgray"]
# title, y label, [(metric key, validation?)], log scale
PANELS = [
    ("Loss", "loss", [("train/loss", False), ("val/loss", True)], False),
    ("Perplexity (training: exp of the loss)", "perplexity", [("train/ppl", False), ("val/ppl", True)], True),
    ("Learning rate", "learning rate", [("train/lr", False)], False),
    ("Solver passes per forward", "passes", [("solver/iterations", False), ("val/solver_iterations", True)], False),
    ("Solver residual (worst in interval)", "relative residual", [("solver/residual", False)], True),
]
GRAD_NORM = ("Gradient norm", "norm", [("train/grad_norm", False)], True)
ACCURACY = ("Accuracy", "accuracy", [("train/accuracy", False), ("val/accuracy", True)], False)
VALIDATION_STYLE: dict[str, Any] = {"linestyle": "--", "marker": "o", "markersize": 3}


def with_train_ppl(run):
    """exp(train/loss) as train/ppl: a training perplexity to set beside the validation one."""
    if run.has("train/loss") and not run.has("train/ppl"):
        tokens, losses = run.series["train/loss"]
        run.series["train/ppl"] = (tokens, [math.exp(min(v, 700.0)) for v in losses])
    return run


def panels_for(runs) -> list[tuple]:
    """The five panels every run has, and accuracy (tasks that report it) or the gradient norm."""
    sixth = ACCURACY if any(run.has("train/accuracy") or run.has("val/accuracy") for run in runs) else GRAD_NORM
    return [*PANELS, sixth]


def legend_names(runs) -> list[str]:
    """Each run by its config name; with its folder's name, or whole path, where names repeat."""
    def repeated(names):
        return [names.count(name) > 1 for name in names]

    names = [run.name for run in runs]
    names = [f"{run.name} ({run.folder.name})" if twice else name
             for run, name, twice in zip(runs, names, repeated(names))]
    return [f"{run.name} ({run.folder})" if twice else name for run, name, twice in zip(runs, names, repeated(names))]


def phase_colours(runs) -> dict[tuple[str, str], str]:
    """A colour per distinct phase (name and settings), in the order the runs bring them."""
    keys = list(dict.fromkeys((span.name, span.label) for run in runs for span in run.phases))
    return {key: PHASE_COLOURS[i % len(PHASE_COLOURS)] for i, key in enumerate(keys)}


STRIP = 0.04  # the height of one run's phase strip (a fraction of the panel) where several runs share it
LAUNCH_MARKERS: dict[str, dict[str, Any]] = {"start": {"marker": "v", "markerfacecolor": "none"},
                                             "resume": {"marker": "v"}}


def phase_band(runs, index: int) -> tuple[float, float]:
    """Where run `index`'s phases are shaded: one run over the whole panel, several each in a strip."""
    return (0.0, 1.0) if len(runs) == 1 else (index * STRIP, (index + 1) * STRIP)


def shade_phases(ax, runs, colours) -> None:
    """Each run's phase spans in its band (edged in the run's colour where there are several runs);
    each run's phase changes as dotted lines in its colour."""
    for index, run in enumerate(runs):
        low, high = phase_band(runs, index)
        several = len(runs) > 1
        for span in run.phases:
            ax.axvspan(span.start_tokens, span.end_tokens, ymin=low, ymax=high,
                       facecolor=colours[(span.name, span.label)], alpha=0.8 if several else 0.35,
                       edgecolor=f"C{index}" if several else "none", linewidth=0.8 if several else 0, zorder=0)
            if span.first_step > 0:
                ax.axvline(span.start_tokens, color=f"C{index}", linestyle=":", linewidth=0.8, zorder=1)


def mark_launches(ax, runs) -> None:
    """Where each launch began: a triangle at the panel's top in its run's colour (hollow: a first start,
    filled: a resume)."""
    for index, run in enumerate(runs):
        for kind, style in LAUNCH_MARKERS.items():
            tokens = [t for t, k in run.launches if k == kind]
            if tokens:
                ax.plot(tokens, [1.0] * len(tokens), linestyle="none", markersize=7, color=f"C{index}",
                        transform=ax.get_xaxis_transform(), clip_on=False, zorder=3, **style)


def token_text(tokens: float, _position=None) -> str:
    """Tick labels in thousands, millions, billions of tokens."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(tokens) >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def draw_panel(ax, panel, runs) -> None:
    title, ylabel, keys, log = panel
    drawn = [run.series[key][1] for run in runs for key, _ in keys if run.has(key)]
    for index, run in enumerate(runs):
        for key, validation in keys:
            if run.has(key):
                tokens, values = run.series[key]
                ax.plot(tokens, values, color=f"C{index}", **(VALIDATION_STYLE if validation else {"linewidth": 1.2}))
    if not drawn:
        ax.text(0.5, 0.5, "not logged by these runs", transform=ax.transAxes, ha="center", va="center", color="0.5")
    elif log and all(v > 0 for values in drawn for v in values):
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("tokens")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(token_text)


def legend(fig, runs, names, colours) -> None:
    """One legend for the figure: the runs by colour, training and validation by style, the phases."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = [Line2D([], [], color=f"C{i}", linewidth=2, label=name) for i, name in enumerate(names)]
    handles += [Line2D([], [], color="0.3", linewidth=1.2, label="training"),
                Line2D([], [], color="0.3", label="validation", **VALIDATION_STYLE)]
    handles += [Patch(color=colour, alpha=0.5, label=f"phase {name} {label}") for (name, label), colour in
                colours.items()]
    kinds = {kind for run in runs for _, kind in run.launches}
    handles += [Line2D([], [], color="0.3", linestyle="none", markersize=7, label=f"a launch: {words}",
                       **LAUNCH_MARKERS[kind]) for kind, words in (("start", "start"), ("resume", "resume"))
                if kind in kinds]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)


def figure(runs, title: str | None = None):
    """Every panel for these runs, as a matplotlib figure."""
    from implicit_megatron.evaluation.plots import pyplot

    plt = pyplot()
    runs = [with_train_ppl(run) for run in runs]
    names, colours = legend_names(runs), phase_colours(runs)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9), sharex=True)
    for ax, panel in zip(axes.flat, panels_for(runs)):
        shade_phases(ax, runs, colours)
        draw_panel(ax, panel, runs)
        mark_launches(ax, runs)
        ax.tick_params(labelbottom=True)
    legend(fig, runs, names, colours)
    rows = math.ceil((len(runs) + 4 + len(colours)) / 4)
    fig.suptitle(title or ", ".join(names))
    fig.tight_layout(rect=(0, 0.025 * rows + 0.01, 1, 0.98))
    return fig


def plot(runs, output: Path, title: str | None = None) -> Path:
    """Every panel for these runs into one PNG at `output`."""
    from implicit_megatron.evaluation.plots import pyplot

    fig = figure(runs, title)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    pyplot().close(fig)
    return output
