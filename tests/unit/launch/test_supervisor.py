"""The launch's half of a graceful stop (launch/supervisor.py), with a real child process."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from implicit_megatron.launch.supervisor import ARMED_FILE, Signals, ask_stop, supervise
from implicit_megatron.train.stopping import PREEMPTED_FILE, STOP_FILE

# a stand-in launcher: waits for the stop file, then stops "gracefully" as ranks do (record, exit 143)
LAUNCHER = """
import json, os, pathlib, sys, time
folder = pathlib.Path(sys.argv[1])
assert os.environ["IMPLICIT_MEGATRON_LAUNCHER_STOP_FILE"] == "1" and os.getsid(0) == os.getpid()
(folder / "started").write_text(os.environ["IMPLICIT_MEGATRON_LAUNCH_PID"])
while not (folder / "stop-requested").exists():
    time.sleep(0.02)
reason = (folder / "stop-requested").read_text().strip()
(folder / "preempted.json").write_text(json.dumps({"step": 3, "checkpoint": "x", "reason": reason}))
sys.exit(143)
"""


@pytest.mark.processes
def test_a_stop_signal_writes_the_stop_file_and_a_graceful_end_exits_0(tmp_path, capfd):
    signals = Signals()

    def hang_up_once_started():  # as the handler counts a SIGHUP that comes while the launcher runs
        while not (tmp_path / "started").exists():
            time.sleep(0.02)
        signals._count(signal.SIGHUP, None)

    threading.Thread(target=hang_up_once_started, daemon=True).start()
    code = supervise([sys.executable, "-c", LAUNCHER, str(tmp_path)], tmp_path, dict(os.environ), signals,
                     multi_node=False, tracking_uri=None)
    assert code == 0 and (tmp_path / "started").read_text() == str(os.getpid())
    assert json.loads((tmp_path / PREEMPTED_FILE).read_text())["reason"] == "SIGHUP (the terminal closed)"
    assert "pretrain.sh: stopped early with a checkpoint" in capfd.readouterr().err


@pytest.mark.processes
def test_a_launcher_that_fails_without_a_stop_record_gives_its_status(tmp_path):
    code = supervise([sys.executable, "-c", "raise SystemExit(5)"], tmp_path, dict(os.environ), Signals(),
                     multi_node=False, tracking_uri=None)
    assert code == 5 and not (tmp_path / PREEMPTED_FILE).exists()


def test_a_stop_before_the_ranks_start_starts_nothing(tmp_path, capfd):
    (tmp_path / PREEMPTED_FILE).write_text("{}")  # an earlier launch's record goes
    signals = Signals()
    signals.counts[signal.SIGTERM] = 1
    code = supervise([sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"], tmp_path, dict(os.environ),
                     signals, multi_node=False, tracking_uri=None)
    assert code == 0 and not (tmp_path / "ran").exists()
    assert json.loads((tmp_path / PREEMPTED_FILE).read_text()) == {"step": None, "checkpoint": None,
                                                                   "reason": "SIGTERM before the launch"}
    assert "stopped by SIGTERM before the ranks started" in capfd.readouterr().err


def test_the_stop_file_is_written_on_a_full_disk_from_the_armed_file(tmp_path, monkeypatch):
    (tmp_path / ARMED_FILE).write_text("SIGTERM\n")
    real = type(tmp_path).write_text

    def full(self, *args, **kwargs):
        if self.name == STOP_FILE + ".tmp":
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "write_text", full)
    ask_stop(tmp_path, "SIGINT (Ctrl-C)")
    assert (tmp_path / STOP_FILE).read_text() == "SIGTERM\n" and not (tmp_path / ARMED_FILE).exists()


def test_signals_are_acted_on_once_each(monkeypatch):
    monkeypatch.setenv("IMPLICIT_MEGATRON_STOP_ASKED", "SIGTERM")
    signals = Signals()
    assert signals.asked() == "SIGTERM" and "IMPLICIT_MEGATRON_STOP_ASKED" not in os.environ
    signals.counts[signal.SIGINT] = 1
    assert signals.new() == [signal.SIGINT] and signals.new() == []
