"""Faults for the multi-process tests, injected into the processes a launcher starts.

Python imports `sitecustomize` at start-up from the first folder of sys.path that has one; a test
puts this folder on PYTHONPATH and names its faults in TEST_FAULTS (support.processes.faults):

    {"nan_loss_at_step": 4}              the loss of that step (from 1) is made NaN before backward
    {"loss_jump_at_step": 3}             that step's reported losses are made 1000x (a jump only)
    {"crash_before_latest": "free-step12"}  the process dies as a kill would once every rank has
                                         written that checkpoint, before `latest` names it
    {"seconds_per_step": 3}              every micro-batch takes that much longer (a step a stop must wait for)
    {"slow_step": [1, 4, 20]}            rank 1's step 4 takes 20 s longer (its heartbeat goes on meanwhile)
    {"hold_start_up": true}              rank 0 ends its start-up only once the launch has asked for a
                                         stop (run_control.StopRequest; it writes `start-up-held` first, so a test
                                         knows when to ask for the stop); a phase name instead of
                                         true: only in the launch of that curriculum phase

They are training callbacks (implicit_megatron.train.callbacks): the project itself reads no fault
settings.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_FAULTS = json.loads(os.environ.get("TEST_FAULTS") or "{}")

if _FAULTS:
    from implicit_megatron.run_control import StopRequest
    from implicit_megatron.train import callbacks

    class _Faults(callbacks.Callback):
        def on_start_up_done(self, cfg):
            held = _FAULTS.get("hold_start_up")
            if held is not None and held in (True, cfg.curriculum.run_phase) and os.environ.get("RANK", "0") == "0":
                Path(cfg.output_dir, "start-up-held").touch()
                deadline = time.monotonic() + 120
                while StopRequest.read(Path(cfg.output_dir)) is None and time.monotonic() < deadline:
                    time.sleep(0.05)

        def on_loss(self, step, loss):
            time.sleep(_FAULTS.get("seconds_per_step", 0))
            slow_rank, slow_step, seconds = _FAULTS.get("slow_step", (None, None, 0))
            if (int(os.environ.get("RANK", "0")), step) == (slow_rank, slow_step):
                time.sleep(seconds)
            return loss * float("nan") if step == _FAULTS.get("nan_loss_at_step") else loss

        def on_step_losses(self, step, losses):
            return [loss * 1000.0 for loss in losses] if step == _FAULTS.get("loss_jump_at_step") else losses

        def before_latest(self, tag):
            if tag == _FAULTS.get("crash_before_latest"):
                os._exit(137)

    callbacks.register(_Faults())
