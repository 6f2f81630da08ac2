"""The lines a person reads while a run trains: one per log interval, one per validation set.

    step 120/1,000 | loss 4.5123 | lr 3.00e-04 | grad 0.842 | passes 5.0 res 3.1e-03 conv 100% |
        412 ms/step | 39,712 tok/s | MFU 41.2% | mem 12.3 GiB | 0:04:12 elapsed, ETA 0:30:11
    val      step 1,000 | loss 4.2010 | ppl 66.74 | passes 12.3 res 2.1e-02 conv 98%

Fields appear where the metrics have them (grad norm where the engine reports one, solver fields for
implicit models, MFU on a GPU whose peak is known); the full-precision numbers go to metrics.jsonl
and the trackers.
"""

from __future__ import annotations

import math


def clock(seconds: float) -> str:
    """h:mm:ss (days as a prefix: 1d 2:03:04)."""
    seconds = max(0, int(round(seconds)))
    days, seconds = divmod(seconds, 86400)
    text = f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{days}d {text}" if days else text


def _solver(metrics: dict[str, float], passes: str, residual: str, converged: str) -> str | None:
    """Solver passes per forward, the residual and the fraction converged, from these keys."""
    if passes not in metrics:
        return None
    parts = [f"passes {metrics[passes]:.1f}"]
    if residual in metrics:
        parts.append(f"res {metrics[residual]:.1e}")
    if converged in metrics:
        parts.append(f"conv {metrics[converged]:.0%}")
    return " ".join(parts)


LEADING = (("train/loss", "loss {:.4f}"), ("train/accuracy", "acc {:.4f}"), ("train/lr", "lr {:.2e}"),
           ("train/grad_norm", "grad {:.3g}"))
SPEED = (("train/step_seconds", lambda v: f"{v * 1e3:,.0f} ms/step"), ("train/tokens_per_s", "{:,.0f} tok/s"),
         ("train/mfu", "MFU {:.1%}"))
MEMORY = (("memory/max_allocated_gib", "mem {:.1f} GiB"), ("memory/host_rss_gib", "RSS {:.1f} GiB"))


def _shown(metrics: dict[str, float], fields) -> list[str]:
    """Each (key, format) whose key the metrics have; a format is a str.format pattern or a function."""
    return [form(metrics[key]) if callable(form) else form.format(metrics[key]) for key, form in fields
            if key in metrics]


def training_line(metrics: dict[str, float], step: int, total: int, elapsed: float, eta: float | None) -> str:
    """One log interval's line. `elapsed`: seconds since this launch's first step; `eta`: seconds
    left to the launch's last step at its pace (None before a step has been timed)."""
    solver = _solver(metrics, "solver/iterations", "solver/residual", "solver/converged_frac")
    memory = " ".join(_shown(metrics, MEMORY))
    fields = [f"step {step:,}/{total:,}", *_shown(metrics, LEADING), *([solver] if solver else []),
              *_shown(metrics, SPEED), *([memory] if memory else []),
              f"{clock(elapsed)} elapsed" + (f", ETA {clock(eta)}" if eta is not None else "")]
    return " | ".join(fields)


def validation_lines(results: dict[str, float], step: int) -> list[str]:
    """One line per validation set (`val`, and a task's others such as `val_len64`), each led by its
    name so that it reads apart from the training lines."""
    names = sorted({key.split("/")[0] for key in results if key.endswith("/loss")}, key=lambda n: (n != "val", n))
    width = max((len(n) for n in names), default=3)
    lines = []
    for name in names:
        fields = [f"{name:<{width}}  step {step:,}", f"loss {results[f'{name}/loss']:.4f}"]
        if f"{name}/accuracy" in results:
            fields.append(f"acc {results[f'{name}/accuracy']:.4f}")
        if f"{name}/ppl" in results and math.isfinite(results[f"{name}/ppl"]):
            fields.append(f"ppl {results[f'{name}/ppl']:.2f}")
        solver = _solver(results, f"{name}/solver_iterations", f"{name}/solver_residual", f"{name}/converged_frac")
        if solver:
            fields.append(solver)
        lines.append(" | ".join(fields))
    return lines


def timers_line(timers: dict[str, float]) -> str:
    """`train.timers`: where a step's time went, in ms per step (solve and phantom are part of the
    forward)."""
    ms = {k.split("/")[-1].removesuffix("_ms"): v for k, v in timers.items()}
    parts = []
    for name in ("data", "forward", "backward", "optimizer"):
        if name not in ms:
            continue
        text = f"{name} {ms[name]:,.1f}"
        if name == "forward" and ("solve" in ms or "phantom" in ms):
            inner = ", ".join(f"{k} {ms[k]:,.1f}" for k in ("solve", "phantom") if k in ms)
            text += f" ({inner})"
        parts.append(text)
    return "time per step (ms): " + " | ".join(parts)


def validation_text(ev: dict) -> str:
    """One validation record as the run's last line gives it."""
    measure = f"accuracy {ev['val/accuracy']:.4f}" if "val/accuracy" in ev else f"perplexity {ev['val/ppl']:.2f}"
    passes = f", {ev['val/solver_iterations']:.1f} solver passes per forward" if "val/solver_iterations" in ev else ""
    return f"validation {measure} (loss {ev['val/loss']:.4f}){passes}"
