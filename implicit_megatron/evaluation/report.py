"""Markdown tables in the paper's layouts, from the results dict that results.json holds.

Table 2: test perplexity and the seven downstream tasks (tasks outside the paper's seven, e.g.
local ones, get columns of their own); Table 7: inference dynamics; Table 8: perplexity at each
evaluation length; and the duality of simultaneous and sequential mode.
"""

from __future__ import annotations

PAPER_COLUMNS = (  # (task, metric, header)
    ("lambada_openai", "perplexity", "LAMBADA ppl↓"), ("lambada_openai", "acc", "LAMBADA acc↑"),
    ("hellaswag", "acc", "HellaSwag acc↑"), ("piqa", "acc", "PIQA acc↑"), ("arc_easy", "acc", "Arc-E acc↑"),
    ("arc_challenge", "acc", "Arc-C acc↑"), ("winogrande", "acc", "WinoGrande acc↑"),
    ("openbookqa", "acc", "OpenbookQA acc↑"),
)
PRIMARY_METRICS = ("acc", "perplexity", "word_perplexity", "exact_match")  # a local task's first column


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main_table(label: str, results: dict, split: str = "test") -> str | None:
    """Table 2: test perplexity, then downstream tasks; the average is over accuracy columns."""
    ppl = results.get("ppl")
    tasks = (results.get("lm_eval") or {}).get("tasks", {})
    if ppl is None and not tasks:
        return None
    headers, row, accs = ["Model"], [label], []
    if ppl is not None:
        headers.append(f"{split.capitalize()} ppl↓ ({ppl['seq_len']})")
        row.append(fmt(ppl["ppl"]))
    columns = [c for c in PAPER_COLUMNS if c[0] in tasks]
    for task in tasks:
        if task not in {c[0] for c in PAPER_COLUMNS}:
            metric = next((m for m in PRIMARY_METRICS if m in tasks[task]), None)
            if metric is not None:
                columns.append((task, metric, f"{task} {metric}"))
    for task, metric, header in columns:
        value = tasks[task].get(metric)
        headers.append(header)
        row.append(fmt(value, 2 if "perplexity" in metric else 4))
        if metric == "acc" and value is not None:
            accs.append(value)
    if accs:
        headers.append("Average acc↑")
        row.append(fmt(sum(accs) / len(accs), 4))
    return table(headers, [row])


def dynamics_table(label: str, dynamics: dict, split: str = "test") -> str:
    """Table 7: perplexity, solver passes and the final relative residual in simultaneous mode."""
    headers = ["Model", f"{split.capitalize()} ppl ({dynamics['seq_len']})", "Inference steps", "Phantom steps",
               "Rel. Diff.", "Converged", "Seq. steps/token"]
    row = [label, fmt(dynamics["ppl"]), fmt(dynamics["mean_passes"], 1), str(dynamics["phantom_steps"]),
           fmt(dynamics["residual"], 3), f"{100 * dynamics['converged_frac']:.1f} %",
           fmt(dynamics.get("sequential_mean_passes"), 1)]
    return table(headers, [row])


def lengths_table(label: str, extrapolation: dict) -> str:
    """Table 8: perplexity at each evaluation length."""
    lengths = sorted(extrapolation["lengths"], key=int)
    headers = ["Model", *(f"{length} ppl↓" for length in lengths)]
    return table(headers, [[label, *(fmt(extrapolation["lengths"][length]["ppl"]) for length in lengths)]])


def duality_table(label: str, duality: dict) -> str:
    headers = ["Model", "Length", "Tokens", "Greedy match", "ppl simultaneous", "ppl sequential", "Δ ppl"]
    row = [label, str(duality["seq_len"]), str(duality["tokens"]), f"{100 * duality['match_rate']:.2f} %",
           fmt(duality["ppl_simultaneous"], 3), fmt(duality["ppl_sequential"], 3),
           f"{duality['ppl_difference']:+.4f}"]
    return table(headers, [row])


def render(results: dict) -> str:
    """The whole results.md."""
    label, split = results["model"]["label"], results["data"]["split"]
    data = results["data"]
    where = f"data: `{data['prefix']}` ({split} split); " if data.get("prefix") else ""
    parts = [f"# Evaluation of {label}", "",
             f"Source: `{results['model']['source']}`; {where}solver: {describe_solver(results['model']['solver'])}."]
    sections = [("Perplexity and downstream tasks (Table 2 layout)", main_table(label, results, split))]
    if "extrapolation" in results:
        sections.append(("Length extrapolation (Table 8 layout)", lengths_table(label, results["extrapolation"])))
    if "dynamics" in results:
        sections.append(("Inference dynamics (Table 7 layout)", dynamics_table(label, results["dynamics"], split)))
    if "duality" in results:
        sections.append(("Duality of simultaneous and sequential mode", duality_table(label, results["duality"])))
    for title, body in sections:
        if body:
            parts += ["", f"## {title}", "", body]
    return "\n".join(parts) + "\n"


def describe_solver(solver: dict) -> str:
    if not solver.get("implicit"):
        return "explicit model (one pass)"
    phase = f"phase {solver['phase']}, " if solver.get("phase") else ""
    return f"{phase}{solver['label']}, at most {solver['cap']} passes, tolerance {solver['tol']}"
