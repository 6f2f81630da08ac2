"""The acceptance run of a new GPU node, as one command within a time budget.

    bash tools/node/gpu_acceptance.sh --out DIR [--budget 500] [--only checks,speed-mamba2]
    python tools/node/gpu_acceptance.py --out DIR --dry      # CPU, tiny shapes: the run itself checked

The steps, most important first, each a command of its own bounded by `timeout` (seconds):

  checks        tools/node/gpu_check.py --skip-speed --skip-fused: which fused kernels import, the
                collective, CUDA graphs against eager (three optimizer steps of two accumulated
                micro-batches, weight norm on; explicit, (4+1), (24+4), (24+4) at eps 0.05), peak
                memory eager against graphs
  speed-mamba2  tools/bench/bench_implicit.py, Mamba2-130M, bf16, 8 x 2048: explicit, (4+1), (4+4),
                (24+4) at 24 passes and at eps 0.05, eager and graphs; ms/step, tokens/s, MFU, peak
                memory, host share
  speed-llama   the same for Llama-130M
  generate      tools/bench/bench_generate.py: batched generation at batch 1 and 32, cold and warm

Not in it: the fused kernels against the PyTorch path (tools/node/validate_kernels.py --dtype bf16).
Compiling and autotuning each fused variant takes minutes on a fresh node (an H200 spent over 150 s
on the first two of its four), so it is a visit of its own. Triton keeps autotuning choices on disk
(models/kernels.py), so the steps after the first reuse what the first tuned.

A step starts only when the time left covers its timeout, so the whole run ends within the budget
(500 s: one GPU visit's 15 minutes hold the machine's start, this run and one rerun of a part).
Everything goes to DIR: one log per step (NN-name.log, each line with the seconds since the step
began) and report.md, written again after each step (status, seconds, the step's last lines), so a
run cut off still reports what it finished and where its time went. Each step's output is printed
as it comes. Exits 0 when every step that ran passed, 1 otherwise.

`--dry` runs the same steps on the CPU at tiny shapes with the same plumbing (timeouts, logs, report);
the steps that need a GPU (checks) report `no GPU`, as they do on such a machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 500
SPEED_MODES = "explicit,(4+1),(4+4),(24+4) fixed,(24+4) eps=0.05"


@dataclass(frozen=True)
class Step:
    name: str
    timeout_s: int
    argv: tuple[str, ...]  # on a GPU node
    dry_argv: tuple[str, ...]  # on a CPU, tiny shapes


def speed(config: str, dry: bool) -> tuple[str, ...]:
    if dry:
        return ("tools/bench/bench_implicit.py", "--configs", config, "--device", "cpu", "--dtype", "fp32",
                "--batch", "1", "--seq-len", "16", "--repeats", "1", "--modes", "explicit,(4+1)", "--graphs", "off")
    return ("tools/bench/bench_implicit.py", "--configs", config, "--device", "cuda", "--dtype", "bf16",
            "--batch", "8", "--seq-len", "2048", "--repeats", "3", "--modes", SPEED_MODES, "--graphs", "off,auto")


STEPS = [
    Step("checks", 240, ("tools/node/gpu_check.py", "--skip-speed", "--skip-fused", "--config", "mamba2/130m-implicit"),
         ("tools/node/gpu_check.py", "--skip-speed", "--skip-fused", "--config", "tiny/mamba2-implicit")),
    Step("speed-mamba2", 150, speed("mamba2/130m-implicit", False), speed("tiny/mamba2-implicit", True)),
    Step("speed-llama", 50, speed("llama/130m-implicit", False), speed("tiny/llama-implicit", True)),
    Step("generate", 50, ("tools/bench/bench_generate.py", "--device", "cuda", "--batches", "1,32",
                          "--models", "mamba2/130m-implicit", "--prompt-lengths", "8,16", "--new-tokens", "8",
                          "--repeats", "1"),
         ("tools/bench/bench_generate.py", "--device", "cpu", "--batches", "1,2", "--models", "tiny/mamba2-implicit",
          "--prompt-lengths", "4,8", "--new-tokens", "2", "--repeats", "1")),
]


@dataclass
class Outcome:
    step: Step
    status: str  # ok, FAIL (exit N), timeout, no GPU, skipped: ...
    seconds: float
    tail: list[str]


def run_step(step: Step, dry: bool, log: Path) -> Outcome:
    """The step's command under its timeout, its output printed and written to `log` as it comes."""
    argv = [sys.executable, *(step.dry_argv if dry else step.argv)]
    start = time.monotonic()
    lines: list[str] = []
    with log.open("w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

        def copy() -> None:  # the output as it comes, while the main thread keeps the time
            assert proc.stdout is not None
            for line in proc.stdout:
                print(f"[{step.name}] {line}", end="", flush=True)
                out.write(f"{time.monotonic() - start:6.1f} s  {line}")  # where a cut-off step spent its time
                out.flush()
                lines.append(line.rstrip("\n"))

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=step.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and whatever it started
            proc.wait()
            code = None
        reader.join(timeout=10)
        if code is None:
            out.write(f"killed after {step.timeout_s} s\n")
            return Outcome(step, "timeout", time.monotonic() - start, lines[-12:])
    if code == 2 and any("no GPU" in line for line in lines):
        status = "no GPU"
    else:
        status = "ok" if code == 0 else f"FAIL (exit {code})"
    return Outcome(step, status, time.monotonic() - start, lines[-12:])


def write_report(out: Path, outcomes: list[Outcome], budget: int, dry: bool) -> None:
    rows = ["| step | status | seconds | timeout |", "| --- | --- | --- | --- |"]
    rows += [f"| {o.step.name} | {o.status} | {o.seconds:.0f} | {o.step.timeout_s} |" for o in outcomes]
    parts = [f"# GPU acceptance run{' (dry: CPU, tiny shapes)' if dry else ''}", "",
             f"budget {budget} s; {sum(o.seconds for o in outcomes):.0f} s used", "", *rows]
    for o in outcomes:
        parts += ["", f"## {o.step.name}: {o.status}", "", "```", *o.tail, "```"]
    (out / "report.md").write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the folder for report.md and each step's log")
    parser.add_argument("--budget", type=int, default=BUDGET_S, help="seconds for the whole run")
    parser.add_argument("--only", default=None, help=f"comma-separated steps, of: {', '.join(s.name for s in STEPS)}")
    parser.add_argument("--dry", action="store_true", help="on the CPU at tiny shapes")
    args = parser.parse_args(argv)
    names = [s.name for s in STEPS]
    wanted = names if args.only is None else args.only.split(",")
    unknown = [name for name in wanted if name not in names]
    if unknown:
        parser.error(f"--only: no step {', '.join(unknown)} (steps: {', '.join(names)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, outcomes = time.monotonic(), []
    for number, step in enumerate(s for s in STEPS if s.name in wanted):
        left = args.budget - (time.monotonic() - start)
        if left < step.timeout_s:
            outcomes.append(Outcome(step, f"skipped: {left:.0f} s left of the budget", 0.0, []))
        else:
            outcomes.append(run_step(step, args.dry, out / f"{number:02d}-{step.name}.log"))
        write_report(out, outcomes, args.budget, args.dry)
        print(f"[acceptance] {step.name}: {outcomes[-1].status} ({outcomes[-1].seconds:.0f} s)", flush=True)
    passing = ("ok", "no GPU") if args.dry else ("ok",)  # a GPU node without a GPU fails
    failed = [o for o in outcomes if o.status not in passing]
    print(f"[acceptance] report: {out / 'report.md'}; {len(outcomes) - len(failed)} of {len(outcomes)} steps passed",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
