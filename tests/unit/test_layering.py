"""Dependencies point one way: the config is plain data, checkpoints/evaluation/hf never reach into
the trainer (checked in fresh interpreters, from what `sys.modules` holds after the imports), and no
module of the project imports itself through others (read from the source, every import counted)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT

PACKAGES = ("implicit_megatron", "data_pipeline")

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


@pytest.mark.processes
def test_the_config_is_plain_data():
    names = loaded("implicit_megatron.config", "implicit_megatron.config.rules")
    outside = [n for n in names if n.startswith(("implicit_megatron.train", "implicit_megatron.evaluation",
                                                 "implicit_megatron.prelaunch", "data_pipeline"))]
    assert not outside, outside


@pytest.mark.processes
def test_checkpoints_evaluation_and_hf_do_not_reach_into_the_trainer():
    names = loaded("implicit_megatron.checkpoints", "implicit_megatron.evaluation", "implicit_megatron.hf", walk=True)
    assert not [n for n in names if n.startswith("implicit_megatron.train")]
    assert "implicit_megatron.checkpoints.universal" in names and "implicit_megatron.evaluation.runner" in names
    assert "implicit_megatron.hf.released" in names


def project_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages (a package is its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(name: str, path: Path, modules: dict[str, Path]):
    """Every module of the project that `path` imports anywhere in its text: at the top, inside
    functions, under `if TYPE_CHECKING` and in `__main__` blocks. `from a import b` is module a.b
    when b is a module, else a; parents of an imported module are not counted as its importers."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_import_circles_are_found(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    modules = {"p": Path("p/__init__.py"), "p.q": Path("p/q.py"), "p.r": Path("p/r.py")}
    source = tmp_path / "s.py"
    source.write_text("from . import q\nfrom .r import thing\nimport p.q\n\n\ndef f():\n    from p import missing\n")
    assert list(imported_names("p.s", source, modules)) == ["p.q", "p.r", "p.q", "p"]


def test_no_module_imports_itself_through_others():
    modules = project_modules()
    graph = {name: {m for m in imported_names(name, path, modules) if m in modules and m != name}
             for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 200  # the walk sees the project's imports
    assert import_circles(graph) == []


def test_utils_is_the_ground_floor():
    """implicit_megatron.utils imports nothing of the project outside itself (read from the source,
    every import counted), so every package may use it without reaching up."""
    modules = project_modules()
    reaching = {name: sorted(m for m in imported_names(name, path, modules)
                             if m.startswith(PACKAGES) and not m.startswith("implicit_megatron.utils"))
                for name, path in modules.items() if name.startswith("implicit_megatron.utils")}
    assert len(reaching) >= 5
    assert {name: up for name, up in reaching.items() if up} == {}


CHECK_PROBE = """
import runpy, sys
sys.argv = ["implicit_megatron.config", *{args}]
try:
    runpy.run_module("implicit_megatron.config", run_name="__main__")
except SystemExit as end:
    print("exit", end.code, sorted(m for m in ("torch", "deepspeed", "megatron") if m in sys.modules))
"""


@pytest.mark.processes
@pytest.mark.parametrize("config", ["configs/quickstart.yaml", "configs/tiny/mamba2-curriculum.yaml"])
def test_the_config_check_before_each_launch_imports_no_torch(config):
    """launch/pretrain.sh and curriculum.sh check the config before any process starts: without torch
    that check takes a fraction of a second instead of two."""
    args = [config, "--world-size", "2", "--get", "output_dir"]
    result = subprocess.run([sys.executable, "-c", CHECK_PROBE.format(args=args)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "exit 0 []", result.stdout + result.stderr[-3000:]
