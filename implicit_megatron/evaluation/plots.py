"""PNG figures like the paper's: per-position perplexity (length extrapolation), solver passes per
token, and the per-position perplexity difference between sequential and simultaneous mode."""

from __future__ import annotations

from pathlib import Path

from implicit_megatron.utils.extras import require
from implicit_megatron.utils.safe_write import replaced_files


def pyplot():
    """matplotlib's pyplot on its file-only backend (no display on clusters); without matplotlib the
    MissingExtra line that says how to install it."""
    matplotlib = require("matplotlib", "drawing figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _centres(buckets: list[dict]) -> list[float]:
    return [(b["start"] + b["end"]) / 2 for b in buckets]


def per_position_plot(extrapolation: dict, train_len: int, label: str, out: Path) -> Path:
    """Perplexity per position bucket at each evaluation length; the trained length is shaded."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for length in sorted(extrapolation["lengths"], key=int):
        buckets = extrapolation["lengths"][length]["positions"]
        ax.plot(_centres(buckets), [b["ppl"] for b in buckets], marker=".", label=f"L = {length}")
    ax.axvspan(0, train_len, color="0.85", zorder=0, label="trained length")
    return _save(plt, fig, ax, "perplexity", f"Per-position perplexity: {label}", out, legend=True)


def passes_plot(dynamics: dict, label: str, out: Path) -> Path:
    """Solver passes per token in sequential mode against the position; simultaneous mean for scale."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    buckets = dynamics.get("passes_per_position") or []
    if buckets:
        ax.plot(_centres(buckets), [b["passes"] for b in buckets], marker=".", label="sequential (per token)")
    ax.axhline(dynamics["mean_passes"], color="C1", linestyle="--", label="simultaneous (per forward)")
    ax.set_ylim(bottom=0)
    return _save(plt, fig, ax, "solver passes", f"Iterations per token: {label}", out, legend=True)


def duality_plot(duality: dict, label: str, out: Path) -> Path:
    """Perplexity difference (sequential - simultaneous) per position bucket, as the paper's Fig. 1C."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    buckets = duality["positions"]
    ax.plot(_centres(buckets), [b["difference"] for b in buckets], marker=".")
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    title = f"Duality: {label}, greedy match {100 * duality['match_rate']:.2f} %"
    return _save(plt, fig, ax, "ppl sequential − ppl simultaneous", title, out, legend=False)


def finish(plt, fig, ax, xlabel: str, ylabel: str, title: str, out: Path) -> Path:
    """Label a sweep page's figure (a small legend), write the PNG, free the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return write_png(plt, fig, out, dpi=110)


def _save(plt, fig, ax, ylabel: str, title: str, out: Path, legend: bool) -> Path:
    """Every plot here has token positions on x; label, title, write the PNG, free the figure."""
    ax.set_xlabel("token position")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend()
    fig.tight_layout()
    return write_png(plt, fig, out, dpi=120)


def write_png(plt, fig, out: Path, dpi: int) -> Path:
    """The figure as `out`, written whole or not at all (safe_write.replaced_files: a full disk leaves
    the plot there before, not a cut one); the figure is freed either way."""
    try:
        with replaced_files([out]) as (partial,):
            fig.savefig(partial, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return out


def runs_figure(folder: Path, tag: str) -> list[str]:
    """The page lines for a sweep's training curves (<tag>-runs.png, tools/plot_run.py's panels drawn
    from the run folders when the sweep was published), or none where that figure was not drawn."""
    if not (folder / f"{tag}-runs.png").is_file():
        return []
    return [f"![training of each model (tools/plot_run.py)]({folder.name}/{tag}-runs.png)", ""]
