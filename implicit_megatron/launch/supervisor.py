"""The launch's half of a graceful stop: signals in, the stop file out, the launcher watched to its end.

The launcher runs in a session of its own, so that a terminal's Ctrl-C reaches this process only.
SIGTERM, SIGHUP (the terminal closed) or a first Ctrl-C writes STOP_FILE in the output folder, which
rank 0 reads at its next step: the ranks finish it, save a checkpoint and exit 0, rank 0 writing
PREEMPTED_FILE, which says the stop was graceful when the launcher itself exits non-zero (it got the
signal too). A second Ctrl-C kills the launcher and its ranks at once; their MLflow run, which they
could not end, is recorded KILLED here, once. A stop asked before the ranks start ends the launch
at once, as a graceful stop with nothing trained. The handlers only count; the watch loop acts.

The ranks know their launch (IMPLICIT_MEGATRON_LAUNCH_PID and _HOST): they end, exit status 3,
when it is gone (a kill -9 of its process group), and rank 0 says so in one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from implicit_megatron.launch import node_shell
from implicit_megatron.launch.environment import PROG
from implicit_megatron.train.stopping import (
    LAUNCHER_OWNS_STOP_FILE,
    PREEMPTED_FILE,
    REASONS,
    STOP_ASKED_BEFORE_START,
    STOP_FILE,
)

ARMED_FILE = STOP_FILE + ".armed"  # written while there is room: a stop on a full disk needs no new space


class Signals:
    """Counts of the signals that ask for a stop, as the handlers took them."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(REASONS, 0)
        self.acted = dict.fromkeys(REASONS, 0)
        self.before = os.environ.pop(STOP_ASKED_BEFORE_START, None)  # what the front door's trap took

    def install(self, *signums: signal.Signals) -> Signals:
        for signum in signums:
            signal.signal(signum, self._count)
        return self

    def _count(self, signum, frame) -> None:
        self.counts[signal.Signals(signum)] += 1

    def asked(self) -> str | None:
        """What asked for a stop so far (None: nothing)."""
        return self.before or next((REASONS[s] for s, n in self.counts.items() if n), None)

    def new(self) -> list[signal.Signals]:
        """The signals that came since the last call, once each."""
        fresh = [s for s in REASONS if self.counts[s] > self.acted[s]]
        self.acted = dict(self.counts)
        return fresh


def ask_stop(folder: Path, reason: str) -> None:
    """Write STOP_FILE naming the reason; on a full disk the armed file is renamed into it instead."""
    staged = folder / (STOP_FILE + ".tmp")
    try:
        staged.write_text(reason + "\n")
    except OSError:
        os.replace(folder / ARMED_FILE, staged)
    os.replace(staged, folder / STOP_FILE)


def arm(folder: Path) -> None:
    """Before the ranks start: no stop file or stop record of an earlier launch, the armed file ready."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (PREEMPTED_FILE, STOP_FILE):
        (folder / stale).unlink(missing_ok=True)
    (folder / ARMED_FILE).write_text("SIGTERM\n")


def stopped_before_start(folder: Path, reason: str) -> int:
    record = {"step": None, "checkpoint": None, "reason": f"{reason} before the launch"}
    (folder / PREEMPTED_FILE).write_text(json.dumps(record) + "\n")
    print(f"{PROG}: stopped by {reason} before the ranks started: nothing was trained; launch again to resume",
          file=sys.stderr, flush=True)
    return 0


def rank_environment(environ: dict[str, str]) -> dict[str, str]:
    """What every rank of this launch is told of it: the stop file is the launch's, and who it is."""
    return {**environ, LAUNCHER_OWNS_STOP_FILE: "1", "IMPLICIT_MEGATRON_LAUNCH_PID": str(os.getpid()),
            "IMPLICIT_MEGATRON_LAUNCH_HOST": os.uname().nodename}


def supervise(command: list[str], folder: Path, environ: dict[str, str], signals: Signals,
              multi_node: bool, tracking_uri: str | None) -> int:
    """Run the launcher to its end, acting on the stop signals; the launch's exit status."""
    arm(folder)
    if signals.asked():
        return stopped_before_start(folder, signals.asked() or "SIGTERM")
    signals.install(signal.SIGINT)
    environ = rank_environment(environ)
    env_file = None
    if multi_node:  # DeepSpeed's pdsh launch hands each node the lines of one environment file: ours
        env_file = node_shell.write_environment_file(environ)
        environ["DS_ENV_FILE"] = env_file
    try:
        child = subprocess.Popen(command, env=environ, start_new_session=True)
        code = None
        while code is None:
            try:
                code = child.wait(timeout=0.2)  # a signal cuts the wait short: acted on at once
            except subprocess.TimeoutExpired:
                if act(signals, child, folder, tracking_uri):
                    return 130
    finally:
        if env_file:
            os.unlink(env_file)
    if code != 0 and (folder / PREEMPTED_FILE).is_file():
        print(f"{PROG}: stopped early with a checkpoint ({(folder / PREEMPTED_FILE).read_text().strip()}); launch "
              "again to resume", file=sys.stderr, flush=True)
        return 0
    return code


def act(signals: Signals, child: subprocess.Popen, folder: Path, tracking_uri: str | None) -> bool:
    """Act on the signals that came; True when a second Ctrl-C has ended the launch at once."""
    for signum in signals.new():
        if signum == signal.SIGINT and signals.counts[signal.SIGINT] > 1:
            kill_at_once(child, folder, tracking_uri)
            return True
        ask_stop(folder, REASONS[signum])
        if signum == signal.SIGINT:
            print(f"{PROG}: Ctrl-C: the ranks finish their step, save a checkpoint and stop (Ctrl-C again: at once)",
                  file=sys.stderr, flush=True)
    return False


def kill_at_once(child: subprocess.Popen, folder: Path, tracking_uri: str | None) -> None:
    """A second Ctrl-C: the launcher's session killed; the run's MLflow end recorded here, once."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    print(f"{PROG}: stopped at once by a second Ctrl-C: what was trained since the last checkpoint is lost",
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from implicit_megatron.tracking.end_run import main as end_run

    end_run([str(folder), "KILLED", tracking_uri or ""])
