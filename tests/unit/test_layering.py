"""Dependencies point one way: the config is plain data, checkpoints/evaluation/export never reach
into the trainer. Checked in fresh interpreters, from what `sys.modules` holds after the imports."""

from __future__ import annotations

import json
import subprocess
import sys

from support.processes import ROOT

PROBE = """
import importlib, json, pkgutil, sys
for name in {modules!r}:
    module = importlib.import_module(name)
    if {walk!r} and hasattr(module, "__path__"):
        for sub in pkgutil.iter_modules(module.__path__):
            importlib.import_module(name + "." + sub.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded(*modules: str, walk: bool = False) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE.format(modules=list(modules), walk=walk)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_config_is_plain_data():
    names = loaded("implicit_megatron.config", "implicit_megatron.config_checks")
    outside = [n for n in names if n.startswith(("implicit_megatron.train", "implicit_megatron.evaluation",
                                                 "implicit_megatron.prelaunch", "data_pipeline"))]
    assert not outside, outside


def test_checkpoints_evaluation_and_export_do_not_reach_into_the_trainer():
    names = loaded("implicit_megatron.checkpoints", "implicit_megatron.evaluation", "implicit_megatron.export",
                   walk=True)
    assert not [n for n in names if n.startswith("implicit_megatron.train")]
    assert "implicit_megatron.checkpoints.universal" in names and "implicit_megatron.evaluation.runner" in names
