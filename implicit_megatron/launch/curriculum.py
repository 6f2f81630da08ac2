"""A curriculum, phase after phase:  python -m implicit_megatron.launch.curriculum CONFIG [key=value ...]

launch/curriculum.sh hands over to this. The plan (implicit_megatron.train.curriculum: each phase's
config checked as its launch will load it, and whether the run's checkpoints finish it) is made
before any phase starts; then each unfinished phase is one launch (pretrain.py) with the nodes,
processes and hostfile the phase names, in this process, so that a stop signal reaches the running
phase as its graceful stop. A phase that stopped early ends the curriculum with exit 0; a stop
asked between phases starts no further phase.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from implicit_megatron.launch.environment import LaunchError
from implicit_megatron.launch.pretrain import launch
from implicit_megatron.launch.supervisor import Signals
from implicit_megatron.train.stopping import PREEMPTED_FILE


def phase_settings(nodes: str, procs: str, hostfile: str) -> dict[str, str]:
    """The environment a phase's launch gets from the phase's own `launch:` keys ("-": not set)."""
    settings = {}
    if nodes != "-":
        settings["NUM_NODES"] = nodes
    if procs != "-":
        settings.update(GPUS_PER_NODE=procs, NPROC=procs)
    if hostfile != "-":
        settings["HOSTFILE"] = hostfile
    return settings


def the_plan(python: str, argv: list[str]) -> list[list[str]]:
    """One row per phase: name, status (done | todo), nodes, processes, hostfile, output folder. It
    runs in a process of its own: it reads checkpoints, with torch, which this launcher does without."""
    made = subprocess.run([python, "-m", "implicit_megatron.train.curriculum", *argv], stdout=subprocess.PIPE,
                          text=True)
    if made.returncode != 0:  # its error is on stderr already, naming the file and key
        raise SystemExit(made.returncode)
    return [row.split("\t") for row in made.stdout.splitlines()]


def run(argv: list[str], signals: Signals) -> int:
    for name, status, nodes, procs, hostfile, output_dir in the_plan(os.environ.get("PYTHON") or "python3", argv):
        if status == "done":
            print(f"[curriculum] phase {name}: finished, skipped", flush=True)
            continue
        if signals.asked():
            print(f"[curriculum] stopped by {signals.asked()} before phase {name}; launch the curriculum again to "
                  "resume it", flush=True)
            return 0
        settings = phase_settings(nodes, procs, hostfile)
        said = " ".join(f"{k}={v}" for k, v in settings.items())
        print(f"[curriculum] phase {name}: starting{' with ' + said if said else ''}", flush=True)
        code = launch([*argv, f"curriculum.run_phase={name}"], {**os.environ, **settings}, signals)
        if code != 0:
            return code
        if (Path(output_dir) / PREEMPTED_FILE).is_file():  # a graceful stop: the phase is not done
            stopped = (Path(output_dir) / PREEMPTED_FILE).read_text().strip()
            print(f"[curriculum] phase {name}: stopped early with a checkpoint ({stopped}); launch the curriculum "
                  "again to resume it", flush=True)
            return 0
    print(f"[curriculum] every phase of {argv[0]} is finished", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    signals = Signals().install(signal.SIGTERM, signal.SIGHUP)
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: bash launch/curriculum.sh CONFIG [key=value ...]", file=sys.stderr)
        return 2
    try:
        return run(argv, signals)
    except LaunchError as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("[curriculum] stopped by Ctrl-C between phases", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
