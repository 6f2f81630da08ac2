"""The launch's half of a graceful stop (launch/supervisor.py), with a real child process."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from implicit_megatron.launch.supervisor import supervise
from implicit_megatron.run_control import ARMED_FILE, STOP_FILE, RunEnd, StopRequest, StopSignals

# a stand-in launcher: waits for the stop request, then stops "gracefully" as ranks do (record, exit 143)
LAUNCHER = """
import os, pathlib, sys, time
from implicit_megatron.run_control import Launch, RunEnd, StopRequest
folder = pathlib.Path(sys.argv[1])
assert os.getsid(0) == os.getpid()
(folder / "started").write_text(str(Launch.of(os.environ).pid))
while StopRequest.read(folder) is None:
    time.sleep(0.02)
RunEnd("stopped", 0, reason=StopRequest.read(folder).reason, step=3, checkpoint="x").write(folder)
sys.exit(143)
"""


@pytest.mark.processes
def test_a_stop_signal_writes_the_stop_file_and_a_graceful_end_exits_0(tmp_path, capfd):
    signals = StopSignals({})

    def hang_up_once_started():  # as the handler counts a SIGHUP that comes while the launcher runs
        while not (tmp_path / "started").exists():
            time.sleep(0.02)
        signals._count(signal.SIGHUP, None)

    threading.Thread(target=hang_up_once_started, daemon=True).start()
    result = supervise([sys.executable, "-c", LAUNCHER, str(tmp_path)], tmp_path, dict(os.environ), signals,
                       multi_node=False, tracking_uri=None)
    assert result.status == 0 and (tmp_path / "started").read_text() == str(os.getpid())
    assert result.stopped and result.end == RunEnd.read(tmp_path)
    assert result.end.reason == "SIGHUP (the terminal closed)"
    assert "pretrain.sh: stopped early with a checkpoint" in capfd.readouterr().err


@pytest.mark.processes
def test_a_launcher_that_fails_without_a_stop_record_gives_its_status(tmp_path):
    (tmp_path / "run-end.json").write_text('{"outcome": "stopped", "exit_status": 0}')  # an earlier launch's
    result = supervise([sys.executable, "-c", "raise SystemExit(5)"], tmp_path, dict(os.environ), StopSignals({}),
                       multi_node=False, tracking_uri=None)
    assert result.status == 5 and result.end is None and RunEnd.read(tmp_path) is None


def test_a_stop_before_the_ranks_start_starts_nothing(tmp_path, capfd):
    RunEnd("finished", 0).write(tmp_path)  # an earlier launch's record goes
    signals = StopSignals({})
    signals._count(signal.SIGTERM, None)
    result = supervise([sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"], tmp_path, dict(os.environ),
                       signals, multi_node=False, tracking_uri=None)
    assert result.status == 0 and not (tmp_path / "ran").exists()
    assert result.end == RunEnd("stopped", 0, reason="SIGTERM before the launch") and RunEnd.read(tmp_path) is None
    assert "stopped by SIGTERM before the ranks started" in capfd.readouterr().err


def test_the_stop_file_is_written_on_a_full_disk_from_the_armed_file(tmp_path, monkeypatch):
    (tmp_path / ARMED_FILE).write_text("SIGTERM\n")
    real = type(tmp_path).write_text

    def full(self, *args, **kwargs):
        if self.name == STOP_FILE + ".tmp":
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "write_text", full)
    StopRequest("SIGINT (Ctrl-C)").write(tmp_path)
    assert (tmp_path / STOP_FILE).read_text() == "SIGTERM\n" and not (tmp_path / ARMED_FILE).exists()


def test_signals_are_acted_on_once_each(monkeypatch):
    monkeypatch.setenv("IMPLICIT_MEGATRON_STOP_ASKED", "SIGHUP")  # as a front door's trap names it
    signals = StopSignals()
    assert signals.asked() == "SIGHUP (the terminal closed)" and "IMPLICIT_MEGATRON_STOP_ASKED" not in os.environ
    signals._count(signal.SIGINT, None)
    assert signals.new() == [signal.SIGINT] and signals.new() == []
