"""A stop asked during the start-up: a process alone ends there; ranks of a larger world carry it to
their first step (under srun each task gets SIGTERM at its own moment, and one rank leaving alone
left the others waiting in the rendezvous)."""

from __future__ import annotations

import os
import signal

import pytest

from implicit_megatron.run_control import STOP_ASKED, STOP_SIGNALS
from implicit_megatron.train import stopping
from implicit_megatron.train.callbacks.preemption import PreemptionCallback


@pytest.fixture
def start_up(monkeypatch):
    """stopping's handlers installed as a rank's start-up installs them; the test's own put back after."""
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    monkeypatch.setattr(stopping, "_signals", None)
    monkeypatch.delenv(STOP_ASKED, raising=False)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_process_alone_stops_in_its_start_up(start_up, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    stopping.signals()
    stopping.check()  # nothing asked yet
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()


def test_ranks_of_a_larger_world_carry_the_stop_to_their_first_step(start_up, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    signals = stopping.signals()
    preemption = PreemptionCallback(signals, tmp_path, rank=1)
    assert not preemption.stop_asked(None)
    os.kill(os.getpid(), signal.SIGINT)
    stopping.check()  # no rank leaves alone
    assert preemption.stop_asked(None) and preemption.why == "SIGINT (Ctrl-C)"


def test_a_sigterm_the_launch_script_took_before_the_rank_started_is_the_ranks(start_up, monkeypatch, tmp_path):
    """launch/pretrain.sh, about to become the rank (`exec`), passes on a SIGTERM its trap took."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(STOP_ASKED, "SIGTERM")
    preemption = PreemptionCallback(stopping.signals(), tmp_path, rank=0)
    assert preemption.stop_asked(None) and preemption.why == "SIGTERM"
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()
