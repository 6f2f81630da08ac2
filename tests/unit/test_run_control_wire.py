"""Run control's wire has one owner (implicit_megatron/run_control.py), read from the source: no other
module spells its file names or environment names or installs a signal handler, and each record has
one writer and one reader: the stop request written by the launch's supervisor and read by rank 0's
preemption callback, the run's end written by the rank's entry and read by the supervisor (which hands
it to the curriculum and the SLURM job)."""

from __future__ import annotations

import ast
import functools
import re

import pytest
from support.processes import ROOT

from implicit_megatron import run_control

SOURCES = [p for folder in ("implicit_megatron", "data_pipeline", "tools", "launch") for p in (ROOT / folder).rglob("*")
           if p.suffix in (".py", ".sh", ".sbatch") and p.name not in ("run_control.py", "mutation_check.py")]


@functools.cache
def code(path) -> str:
    """What `path` runs: a Python module without its comments and docstrings, a script without its
    comment lines (what they say of the wire is documentation, not a use of it)."""
    text = path.read_text()
    if path.suffix != ".py":
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def spelled(pattern: str, folders: tuple[str, ...] = ("implicit_megatron", "data_pipeline", "tools", "launch")):
    """The source files under `folders`, relative to the repository, whose code matches `pattern`."""
    return sorted(str(p.relative_to(ROOT)) for p in SOURCES
                  if p.relative_to(ROOT).parts[0] in folders and re.search(pattern, code(p)))


@pytest.mark.parametrize("name", [run_control.STOP_FILE, run_control.RUN_END_FILE, run_control.STOP_ASKED,
                                  run_control.LAUNCH])
def test_no_other_module_spells_the_wires_names(name):
    assert spelled(re.escape(name)) == []


def test_signals_are_taken_in_one_place():
    """(A developer's tool may time itself with SIGALRM.)"""
    assert spelled(r"signal\.signal\(", ("implicit_megatron", "data_pipeline", "launch")) == []


def test_each_record_has_one_writer_and_one_reader():
    assert spelled(r"RunEnd\.read\(") == ["implicit_megatron/launch/supervisor.py"]
    assert spelled(r"RunEnd\([^)]*\)\.write\(|\bend\.write\(") == ["implicit_megatron/train/__main__.py"]
    assert spelled(r"StopRequest\([^)]*\)\.write\(") == ["implicit_megatron/launch/supervisor.py"]
    assert spelled(r"StopRequest\.read\(") == ["implicit_megatron/train/callbacks/preemption.py"]
