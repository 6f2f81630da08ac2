"""A stop asked during the start-up: a process alone ends there; ranks of a larger world carry it to
their first step (under srun each task gets SIGTERM at its own moment, and one rank leaving alone
left the others waiting in the rendezvous)."""

from __future__ import annotations

import os
import signal

import pytest

from implicit_megatron.train import stopping


@pytest.fixture
def start_up(monkeypatch):
    """stopping's handlers installed as a rank's start-up installs them; the test's own put back after."""
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(stopping, "_requested", None)
    monkeypatch.delenv(stopping.STOP_ASKED_BEFORE_START, raising=False)
    yield
    signal.signal(signal.SIGTERM, saved[0])
    signal.signal(signal.SIGINT, saved[1])


def test_a_process_alone_stops_in_its_start_up(start_up, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    stopping.install()
    stopping.check()  # nothing asked yet
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()


def test_ranks_of_a_larger_world_carry_the_stop_to_their_first_step(start_up, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    stopping.install()
    os.kill(os.getpid(), signal.SIGINT)
    stopping.check()  # no rank leaves alone
    preemption = stopping.Preemption(tmp_path, rank=1)
    assert not preemption.asked()
    preemption.install()
    assert preemption.asked() and preemption.why == "SIGINT (Ctrl-C)"


def test_a_sigterm_the_launch_script_took_before_the_rank_started_is_the_ranks(start_up, monkeypatch, tmp_path):
    """launch/pretrain.sh, about to become the rank (`exec`), passes on a SIGTERM its trap took."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(stopping.STOP_ASKED_BEFORE_START, "SIGTERM")
    stopping.install()
    preemption = stopping.Preemption(tmp_path, rank=0)
    preemption.install()
    assert preemption.asked() and preemption.why == "SIGTERM"
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(stopping.StoppedDuringStartUp):
        stopping.check()
