"""Run control's wire: everything the processes of a launch say to each other, and nothing else.

A launch is a chain of processes: a front door (launch/pretrain.sh, launch/curriculum.sh,
launch/examples/slurm.sbatch), the launch (implicit_megatron/launch/: a curriculum runs its phases'
launches in one process, a SLURM job's launcher is `srun`), the launcher (torchrun, DeepSpeed's,
srun) and the ranks (implicit_megatron/train). Between them, only what is named here:

    signals      STOP_SIGNALS ask any of them for the graceful stop (install_stop_signals takes them,
                 in every process; the front doors' traps are `python -m implicit_megatron.run_control
                 --shell-traps`); a second Ctrl-C, or AT_ONCE_SIGNALS (SIGQUIT), stops at once
    environment  STOP_ASKED: a stop the front door took before the launch ran, or the launch before
                 it became a rank; LAUNCH: the launch whose ranks these are (Launch), which owns the
                 stop request and which a rank ends with when it is gone
    files        in the run's output folder: the stop request (StopRequest, written by the launch, read
                 by rank 0) and the run's end (RunEnd, written by rank 0, read by the launch)

Each record has one `write` and one `read`. This module imports only the standard library: the host's
python3 runs it for a SLURM job, and the front doors before any environment is set up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from implicit_megatron.utils.received_file import UnreadableFile, read_small_json
from implicit_megatron.utils.safe_write import replace_text

# The signals that ask for the graceful stop, and how a stop names each. SIGINT is Ctrl-C: the
# first asks for the graceful stop, a second stops at once.
STOP_SIGNALS: dict[signal.Signals, str] = {
    signal.SIGTERM: "SIGTERM",
    signal.SIGHUP: "SIGHUP (the terminal closed)",
    signal.SIGUSR1: "SIGUSR1 (a scheduler's notice)",  # SLURM's --signal=B:USR1@SECONDS before the time limit
    signal.SIGINT: "SIGINT (Ctrl-C)",
}
# The signal that ends a launch at once, as a second Ctrl-C does: SIGQUIT (Ctrl-\ in a terminal)
# conventionally means quit now, so it asks for no checkpoint; the end is said in one line, no core.
AT_ONCE_SIGNALS: dict[signal.Signals, str] = {signal.SIGQUIT: "SIGQUIT (Ctrl-\\)"}
SECOND_INTERRUPT = "a second Ctrl-C"
STOP_ASKED = "IMPLICIT_MEGATRON_STOP_ASKED"  # environment: the name of a signal taken before the launch ran
LAUNCH = "IMPLICIT_MEGATRON_LAUNCH"  # environment: PID[:START_TICKS]@HOST of the launch that owns these ranks
STOP_FILE = "stop-requested"  # in the output folder: the stop request
ARMED_FILE = STOP_FILE + ".armed"  # written before the ranks start: a stop on a full disk needs no new space
RUN_END_FILE = "run-end.json"  # in the output folder: how the run's last launch ended
OUTCOMES = ("finished", "stopped", "refused", "failed", "killed")


def stop_reason(signum: int) -> str:
    return STOP_SIGNALS[signal.Signals(signum)]


class StopSignals:
    """The stop signals this process has received, counted by handlers that do nothing else (a
    handler that raised would interrupt whatever runs, a C extension's start-up included)."""

    def __init__(self, environ: dict[str, str] | os._Environ = os.environ) -> None:
        self.counts = dict.fromkeys([*STOP_SIGNALS, *AT_ONCE_SIGNALS], 0)
        self.acted = dict(self.counts)
        before = environ.pop(STOP_ASKED, None) or None
        named = {s.name: reason for s, reason in STOP_SIGNALS.items()}
        self.first = named.get(before, before) if before else None  # a front door's trap names the signal
        self.quit: str | None = None  # what asked to stop at once (AT_ONCE_SIGNALS)
        self.at_once: Callable[[str], None] | None = None

    def _count(self, signum, frame) -> None:
        signum = signal.Signals(signum)
        self.counts[signum] += 1
        if signum in AT_ONCE_SIGNALS:
            self.quit = self.quit or AT_ONCE_SIGNALS[signum]
            if self.at_once is not None:
                self.at_once(AT_ONCE_SIGNALS[signum])
            return
        earlier = self.first
        self.first = earlier or STOP_SIGNALS[signum]
        if signum == signal.SIGINT and earlier and self.at_once is not None:
            self.at_once(SECOND_INTERRUPT)

    def note(self, reason: str) -> None:
        """A stop asked another way (the launch's request, a deadline): a Ctrl-C after it is the second."""
        self.first = self.first or reason

    def asked(self) -> str | None:
        """What asked for a stop first (None: nothing yet), as a stop names it."""
        return self.first

    def quit_asked(self) -> str | None:
        """What asked to stop at once (None: nothing), as a stop names it."""
        return self.quit

    def new(self) -> list[signal.Signals]:
        """The signals that came since the last call, once each."""
        fresh = [s for s in self.counts if self.counts[s] > self.acted[s]]
        self.acted = dict(self.counts)
        return fresh

    def interrupts(self) -> int:
        return self.counts[signal.SIGINT]


def install_stop_signals(signals: StopSignals | None = None, *, interrupt: bool = True,
                         at_once: Callable[[str], None] | None = None) -> StopSignals:
    """The one place the stop signals are taken, in every process of a launch. `interrupt`: Ctrl-C
    too (a launch takes it only once its launcher runs: before, it ends the launch at once);
    `at_once(reason)`: what a second Ctrl-C or an AT_ONCE_SIGNALS signal does there and then (a rank
    ends at once; a launch, where this is None, acts on it in its watch loop)."""
    signals = signals or StopSignals()
    signals.at_once = at_once or signals.at_once
    for signum in [*STOP_SIGNALS, *AT_ONCE_SIGNALS]:
        if signum != signal.SIGINT or interrupt:
            signal.signal(signum, signals._count)
    return signals


def ignore_stop_signals(interrupt: bool = False) -> None:
    """Between a launch and the rank it becomes (`exec`: a signal then would end the rank unasked), or
    once a launch has ended its ranks at once (`interrupt`: Ctrl-C too, while it records that)."""
    for signum in [*STOP_SIGNALS, *AT_ONCE_SIGNALS]:
        if signum != signal.SIGINT or interrupt:
            signal.signal(signum, signal.SIG_IGN)


def shell_traps() -> str:
    """The front doors' traps (bash, `eval`ed): a stop signal taken while they set up is handed on."""
    return "".join(f"trap 'export {STOP_ASKED}={s.name}' {s.name[3:]}\n" for s in STOP_SIGNALS if s != signal.SIGINT)


@dataclass(frozen=True)
class Launch:
    """The launch that started these ranks: it owns the stop request, and a rank on its host ends
    when it is gone (a kill -9 of its process group leaves nobody else to stop the ranks)."""

    pid: int
    host: str
    start_ticks: int | None = None  # when it started (Linux): tells a reused process id apart

    def environ(self) -> dict[str, str]:
        ticks = "" if self.start_ticks is None else f":{self.start_ticks}"
        return {LAUNCH: f"{self.pid}{ticks}@{self.host}"}

    @classmethod
    def of(cls, environ: dict[str, str] | os._Environ) -> Launch | None:
        """The launch of these ranks (None: started some other way, e.g. by torchrun or srun directly)."""
        value = environ.get(LAUNCH) or ""
        process, _, host = value.partition("@")
        pid, _, ticks = process.partition(":")
        if not (pid.isdigit() and host and (not ticks or ticks.isdigit())):
            return None
        return cls(int(pid), host, int(ticks) if ticks else None)


@dataclass(frozen=True)
class StopRequest:
    """The launch's request that the ranks stop gracefully; rank 0 reads it at each step."""

    reason: str

    def write(self, folder: Path) -> None:
        """Written whole (rename); on a full disk the armed file is renamed into it instead."""
        staged = folder / (STOP_FILE + ".tmp")
        try:
            staged.write_text(self.reason + "\n")
        except OSError:
            os.replace(folder / ARMED_FILE, staged)
        os.replace(staged, folder / STOP_FILE)

    @staticmethod
    def read(folder: Path) -> StopRequest | None:
        try:
            return StopRequest((folder / STOP_FILE).read_text().strip() or "SIGTERM")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError):
            return StopRequest("SIGTERM")  # asked, whatever it says

    @staticmethod
    def arm(folder: Path) -> None:
        """Before the ranks start: no request of an earlier launch, the armed file ready."""
        folder.mkdir(parents=True, exist_ok=True)
        StopRequest.clear(folder)
        (folder / ARMED_FILE).write_text("SIGTERM\n")

    @staticmethod
    def clear(folder: Path) -> None:
        (folder / STOP_FILE).unlink(missing_ok=True)


@dataclass(frozen=True)
class RunEnd:
    """How the run's last launch ended, as rank 0 saw it: the launch's exit status follows it (a
    graceful stop is exit 0 whatever the launcher says), a curriculum starts no further phase after
    a stop, and a SLURM job requeues itself."""

    outcome: str  # one of OUTCOMES
    exit_status: int  # the ranks'
    reason: str | None = None  # what asked for the stop, or what ended the run
    step: int | None = None  # the last step trained (None: none in this launch)
    checkpoint: str | None = None  # the checkpoint a resume starts from, where this launch saved one

    @property
    def stopped(self) -> bool:
        """A graceful stop: launch again to resume."""
        return self.outcome == "stopped"

    def describe(self) -> str:
        """What ended it and where, e.g. 'SIGTERM after step 6, checkpoint bounded-step6'."""
        after = f" after step {self.step}" if self.step is not None else " before its first step"
        saved = f", checkpoint {self.checkpoint}" if self.checkpoint else ", nothing saved"
        return f"{self.reason or self.outcome}{after}{saved}"

    def write(self, folder: Path) -> None:
        replace_text(folder / RUN_END_FILE, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(folder: Path) -> RunEnd | None:
        """The record, or None where there is none (the ranks were killed) or it is not one."""
        try:
            data = read_small_json(folder / RUN_END_FILE, 1 << 16, "the run's end record")
        except UnreadableFile:
            return None
        names = {f.name for f in fields(RunEnd)}
        if not isinstance(data, dict) or set(data) - names or data.get("outcome") not in OUTCOMES:
            return None
        try:
            return RunEnd(**data)
        except TypeError:
            return None

    @staticmethod
    def clear(folder: Path) -> None:
        (folder / RUN_END_FILE).unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["--shell-traps"]:
        sys.exit("usage: python -m implicit_megatron.run_control --shell-traps")
    sys.stdout.write(shell_traps())
