"""A stop asked during the start-up: a process alone ends there; ranks of a larger world carry it to
their first step (under srun each task gets SIGTERM at its own moment, and one rank leaving alone
left the others waiting in the rendezvous)."""

from __future__ import annotations

import os
import signal

import pytest

from implicit_megatron.run_control import LAUNCH, STOP_ASKED, STOP_SIGNALS, RunEnd, StopRequest, StopSignals
from implicit_megatron.train import stopping
from implicit_megatron.train.callbacks.preemption import Preemption


@pytest.fixture
def start_up(monkeypatch):
    """stopping's handlers installed as a rank's start-up installs them; the test's own put back after."""
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    monkeypatch.setattr(stopping, "_signals", None)
    monkeypatch.delenv(STOP_ASKED, raising=False)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", list(STOP_SIGNALS), ids=lambda s: s.name)
def test_a_process_alone_stops_in_its_start_up(signum, start_up, monkeypatch):
    """Every stop signal run_control names, sent to the rank itself (a scheduler signals every process)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    stopping.signals()
    stopping.check()  # nothing asked yet
    os.kill(os.getpid(), signum)
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()
    assert stopping.requested() == STOP_SIGNALS[signum]


def test_ranks_of_a_larger_world_carry_the_stop_to_their_first_step(start_up, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    signals = stopping.signals()
    preemption = Preemption(signals, tmp_path, rank=1)
    assert not preemption.stop_asked()
    os.kill(os.getpid(), signal.SIGINT)
    stopping.check()  # no rank leaves alone
    assert preemption.stop_asked() and preemption.why == "SIGINT (Ctrl-C)"


def test_a_sigterm_the_launch_script_took_before_the_rank_started_is_the_ranks(start_up, monkeypatch, tmp_path):
    """launch/pretrain.sh, about to become the rank (`exec`), passes on a SIGTERM its trap took."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(STOP_ASKED, "SIGTERM")
    preemption = Preemption(stopping.signals(), tmp_path, rank=0)
    assert preemption.stop_asked() and preemption.why == "SIGTERM"
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()


def test_rank_0_reads_the_launchs_stop_request_and_the_others_wait_for_the_steps_agreement(tmp_path):
    StopRequest("SIGUSR2 (a test's)").write(tmp_path)
    others = Preemption(StopSignals({}), tmp_path, rank=1)
    first = Preemption(StopSignals({}), tmp_path, rank=0)
    assert not others.stop_asked() and others.why == "another rank's stop request"
    assert first.stop_asked() and first.why == "SIGUSR2 (a test's)"


def test_exit_after_minutes_asks_for_the_same_stop(tmp_path):
    preemption = Preemption(StopSignals({}), tmp_path, rank=1, exit_after_minutes=0.0)
    assert preemption.stop_asked() and preemption.why == "train.exit_after_minutes=0"


@pytest.mark.parametrize("launched", [True, False])
def test_a_stop_asked_of_an_earlier_launch_is_not_this_ones(launched, tmp_path, monkeypatch):
    """A rank started directly (srun, torchrun) drops an earlier launch's request and end; under the
    launch they are this launch's (it removed the earlier ones before the ranks started)."""
    monkeypatch.delenv(LAUNCH, raising=False)
    if launched:
        monkeypatch.setenv(LAUNCH, "1@host")
    StopRequest("SIGTERM").write(tmp_path)
    RunEnd("stopped", 0).write(tmp_path)
    Preemption(StopSignals({}), tmp_path, rank=0).before_resume()
    assert (StopRequest.read(tmp_path) is not None) == launched
    assert (RunEnd.read(tmp_path) is not None) == launched


@pytest.mark.processes
def test_sigquit_ends_a_rank_at_once_naming_it(tmp_path):
    """SIGQUIT (quit now) is no graceful stop: the rank ends at once, in one line, exit 131, no core."""
    import subprocess
    import sys

    code = ("import os, signal, time\nfrom implicit_megatron.train import stopping\nstopping.signals()\n"
            "os.kill(os.getpid(), signal.SIGQUIT)\ntime.sleep(30)\n")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 131, shown.stderr[-2000:]
    assert shown.stderr.strip() == "[train] stopped at once by SIGQUIT (Ctrl-\\): what was trained since the last " \
                                   "checkpoint is lost"
