"""The launch's half of a graceful stop: its launcher run and watched to its end, the stop asked of it.

The launcher (torchrun, DeepSpeed's, or a SLURM job's `srun`) runs in a session of its own, so
that a terminal's Ctrl-C reaches this process only. A stop signal (implicit_megatron.run_control:
SIGTERM, SIGHUP, a first Ctrl-C, ...) becomes the stop request in the output folder, which rank 0
reads at its next step: the ranks finish it, save a checkpoint and exit 0, rank 0 writing the run's
end, which says the stop was graceful when the launcher itself exits non-zero (it got the signal
too). A second Ctrl-C, or SIGQUIT (quit now), kills the launcher and its ranks at once; their MLflow
run, which they could not end, is recorded KILLED here, once. A stop asked before the ranks start
ends the launch at once, as a graceful stop with nothing trained. The handlers only count; the watch loop acts.

The ranks know their launch (run_control.Launch): they end, exit status 3, when it is gone (a kill
-9 of its process group), and rank 0 says so in one line. When only their launcher is gone (killed by
a signal) and their launch, on rank 0's host, is alive, rank 0 records the end and the launch says it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.processes import start_ticks
from implicit_megatron.launch import node_shell
from implicit_megatron.launch.environment import PROG
from implicit_megatron.run_control import (
    AT_ONCE_SIGNALS,
    SECOND_INTERRUPT,
    STOP_SIGNALS,
    Launch,
    RunEnd,
    StopRequest,
    StopSignals,
    ignore_stop_signals,
    install_stop_signals,
)

QUIT_STATUS = 128 + signal.SIGQUIT  # a launch ended at once by SIGQUIT, as a shell reports it


@dataclass(frozen=True)
class LaunchResult:
    """A launch's exit status, and how its ranks said the run ended (None: they did not say)."""

    status: int
    end: RunEnd | None = None

    @property
    def stopped(self) -> bool:
        return self.end is not None and self.end.stopped


def rank_environment(environ: dict[str, str]) -> dict[str, str]:
    """What every rank of this launch is told of it: who it is (run_control.Launch)."""
    pid = os.getpid()
    return {**environ, **Launch(pid, os.uname().nodename, start_ticks(pid)).environ()}


def supervise(command: list[str], folder: Path, environ: dict[str, str], signals: StopSignals,
              multi_node: bool, tracking_uri: str | None, prog: str = PROG) -> LaunchResult:
    """Run the launcher to its end, acting on the stop signals."""
    StopRequest.arm(folder)
    RunEnd.clear(folder)  # an earlier launch's: what the folder says from now on is this one's
    if signals.quit_asked():
        print(f"{prog}: stopped at once by {signals.quit_asked()} before the ranks started: nothing was trained",
              file=sys.stderr, flush=True)
        return LaunchResult(QUIT_STATUS)
    if signals.asked():
        print(f"{prog}: stopped by {signals.asked()} before the ranks started: nothing was trained; launch again "
              "to resume", file=sys.stderr, flush=True)
        return LaunchResult(0, RunEnd("stopped", 0, reason=f"{signals.asked()} before the launch"))
    install_stop_signals(signals)  # Ctrl-C included: from here it asks for the graceful stop
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
                status = act(signals, child, folder, tracking_uri, prog)
                if status is not None:
                    return LaunchResult(status)
    finally:
        if env_file:
            os.unlink(env_file)
    end = RunEnd.read(folder) if code >= 0 else killed_end(folder)
    if code < 0 and end is not None and end.outcome == "killed":  # rank 0 left the saying to this launch
        print(f"{prog}: {end.reason} (killed): this launch ends here, what was trained since the last checkpoint "
              "is lost", file=sys.stderr, flush=True)
    if code != 0 and end is not None and end.stopped:
        print(f"{prog}: stopped early with a checkpoint ({end.describe()}); launch again to resume", file=sys.stderr,
              flush=True)
        return LaunchResult(0, end)
    return LaunchResult(code, end)


def act(signals: StopSignals, child: subprocess.Popen, folder: Path, tracking_uri: str | None,
        prog: str) -> int | None:
    """Act on the signals that came; the launch's exit status where one ended it at once (a second
    Ctrl-C: 130; SIGQUIT: 131), else None."""
    for signum in signals.new():
        if signum in AT_ONCE_SIGNALS:
            kill_at_once(child, folder, tracking_uri, prog, AT_ONCE_SIGNALS[signum])
            return QUIT_STATUS
        if signum == signal.SIGINT and signals.interrupts() > 1:
            kill_at_once(child, folder, tracking_uri, prog, SECOND_INTERRUPT)
            return 130
        try:
            StopRequest(STOP_SIGNALS[signum]).write(folder)
        except OSError as err:  # a read-only or vanished run folder: the ranks get the signal itself instead
            print(f"{prog}: {STOP_SIGNALS[signum]}: the stop request cannot be written in {folder} "
                  f"({err.strerror or err}); the ranks are sent the signal itself", file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)  # the launcher hands it on to its ranks (torchrun, srun)
            continue
        if signum == signal.SIGINT:
            print(f"{prog}: Ctrl-C: the ranks finish their step, save a checkpoint and stop (Ctrl-C again: at once)",
                  file=sys.stderr, flush=True)
    return None


def kill_at_once(child: subprocess.Popen, folder: Path, tracking_uri: str | None, prog: str, reason: str) -> None:
    """A second Ctrl-C or SIGQUIT: the launcher's session killed; the run's MLflow end recorded, and the
    end said here, once (rank 0, whose launch is alive, says nothing: train/__main__.py)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    ignore_stop_signals(interrupt=True)
    killed_end(folder)  # rank 0 decides who says the end while this launch is alive: let it decide first
    from implicit_megatron.tracking.end_run import end_run

    try:
        recorded = end_run(folder.resolve(), "KILLED", tracking_uri or None)
    except Exception as err:  # noqa: BLE001 - the launch has ended already; say why the record could not be made
        recorded = f"its MLflow run's end was not recorded ({type(err).__name__}: {err})"
    said = "" if recorded.startswith("no MLflow") else f"; {recorded}"  # tracking off: nothing to say of it
    print(f"{prog}: stopped at once by {reason}: what was trained since the last checkpoint is lost{said}",
          file=sys.stderr, flush=True)


def killed_end(folder: Path, seconds: float = 3.0) -> RunEnd | None:
    """The run's end after the launcher was killed by a signal: its ranks notice within a second (they
    watch it) and rank 0 records it; None where none comes."""
    deadline = time.monotonic() + seconds
    while (end := RunEnd.read(folder)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return end
