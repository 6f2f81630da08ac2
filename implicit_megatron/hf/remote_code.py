"""The code an exported folder carries, so that it loads in a Python without this package.

transformers' AutoModelForCausalLM with `trust_remote_code=True` runs the folder's
`modeling_implicit_megatron.py`. That file and the `im_*.py` beside it are written at export from
the package's own source: each `im_*.py` is one module of the package (`im_models_llama_layer.py` is
`implicit_megatron/models/llama/layer.py`) with its imports of the package made relative, and nothing else
changed; the modules are those the transformers model needs (hf/model.py and hf/config.py, and what
they import: both backbones, the implicit core and its stop rules, sequential-mode generation, and
the export's reader with the config's rules, so that the copy refuses a damaged folder as the package does).
transformers copies a folder's code into its module cache by following `from .NAME import` lines
only, so the modeling file names every module once that way.

Once the package is imported, transformers uses its registered classes (hf/auto.py) and runs none
of these files. A model that transformers loaded from them saves the same files again
(`write_remote_code`, called by the model's `save_pretrained`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = "implicit_megatron"
MODELING_FILE = "modeling_implicit_megatron.py"
AUTO_MAP = {"AutoConfig": "modeling_implicit_megatron.ImplicitMegatronConfig",  # classes of MODELING_FILE
            "AutoModelForCausalLM": "modeling_implicit_megatron.ImplicitMegatronForCausalLM"}
ROOTS = (f"{PACKAGE}.hf.config", f"{PACKAGE}.hf.model")  # the modules of AUTO_MAP's classes
PREFIX = "im_"


def write_remote_code(out: Path) -> list[str]:
    """MODELING_FILE and the package's modules it needs, into folder `out`; returns the file names."""
    if __name__.startswith(PACKAGE + "."):
        files = bundle(Path(__file__).resolve().parents[1])
    else:  # this is a folder's own copy, run by transformers: the files it was loaded from
        files = {p.name: p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("*.py")
                 if p.name == MODELING_FILE or p.name.startswith(PREFIX)}
    for name, text in files.items():
        (Path(out) / name).write_text(text, encoding="utf-8")
    return sorted(files)


def bundle(package_dir: Path) -> dict[str, str]:
    """{file name: text} of MODELING_FILE and every package module ROOTS import, directly or not."""
    modules = closure(package_dir)
    files = {file_name(m): bundled_source(package_dir, m, modules) for m in modules}
    if len(files) < len(modules):
        raise ValueError(f"two modules of {package_dir} flatten to the same file name: {sorted(modules)}")
    files[MODELING_FILE] = modeling_file(modules)
    return files


def closure(package_dir: Path) -> list[str]:
    """ROOTS and the package modules they import, anywhere in their code (functions included)."""
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [target for _, target in package_imports(package_dir, module)]
    return sorted(seen)


def package_imports(package_dir: Path, module: str) -> list[tuple[ast.ImportFrom, str]]:
    """(statement, module it needs) for each import of a package module in `module`'s source."""
    path = source_file(package_dir, module)
    found: list[tuple[ast.ImportFrom, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise ValueError(f"{path}:{node.lineno}: `import {PACKAGE}...`; an export's copy of the package "
                             f"rewrites `from {PACKAGE}.MODULE import NAME` only")
        if isinstance(node, ast.ImportFrom) and node.level:
            raise ValueError(f"{path}:{node.lineno}: a relative import; the package imports by absolute names")
        source = node.module if isinstance(node, ast.ImportFrom) and not node.level else None
        if source and source.split(".")[0] == PACKAGE:
            assert isinstance(node, ast.ImportFrom)
            if source == PACKAGE:
                raise ValueError(f"{path}:{node.lineno}: imports from the package's root, which an export "
                                 f"does not carry; import from the module that defines the name")
            submodules = [a.name for a in node.names if is_module(package_dir, f"{source}.{a.name}")]
            if submodules and len(submodules) < len(node.names):
                raise ValueError(f"{path}:{node.lineno}: imports modules and names in one statement; split it")
            found += [(node, f"{source}.{name}") for name in submodules] if submodules else [(node, source)]
    return found


def bundled_source(package_dir: Path, module: str, modules: list[str]) -> str:
    """`module`'s source, each `from implicit_megatron.X import ...` made `from .im_X import ...`."""
    path = source_file(package_dir, module)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    statements = {id(node): node for node, _ in package_imports(package_dir, module)}.values()
    for node in sorted(statements, key=lambda node: -node.lineno):  # from the end: a rewrite may join lines
        start = node.lineno - 1
        line = lines[start]
        if all(is_module(package_dir, f"{node.module}.{a.name}") for a in node.names):  # modules themselves
            names = ", ".join(f"{file_name(f'{node.module}.{a.name}')[:-3]} as {a.asname or a.name}"
                              for a in node.names)
            lines[start:node.end_lineno] = [f"{line[:node.col_offset]}from . import {names}\n"]
        else:
            source = node.module or ""
            pattern = rf"from\s+{re.escape(source)}\s+import"
            lines[start] = line[:node.col_offset] + re.sub(pattern, f"from .{file_name(source)[:-3]} import",
                                                           line[node.col_offset:], count=1)
    header = f"# {path.relative_to(package_dir.parent)} of the package, its imports of the package made relative\n"
    return header + "".join(lines)


def modeling_file(modules: list[str]) -> str:
    names = "\n".join(f"from .{file_name(m)[:-3]} import __name__ as _" for m in modules)
    return (f'"""This folder\'s model for transformers\' Auto classes in a Python without the {PACKAGE} package:\n'
            f"AutoModelForCausalLM with `trust_remote_code=True`. Written at export: each\n"
            f"{PREFIX}*.py beside this file is a module of the package, its imports of the package made relative\n"
            f'(hf/remote_code.py). Where the package is imported, none of these files runs."""\n\n'
            f"# transformers copies the files that a `from .NAME import` line names, and no other\n{names}\n"
            f"from .{file_name(ROOTS[0])[:-3]} import ImplicitMegatronConfig\n"
            f"from .{file_name(ROOTS[1])[:-3]} import ImplicitMegatronForCausalLM\n\n"
            f'__all__ = ["ImplicitMegatronConfig", "ImplicitMegatronForCausalLM"]\n')


def file_name(module: str) -> str:
    """implicit_megatron.models.llama.layer -> im_models_llama_layer.py; a subpackage's __init__ takes its name."""
    return PREFIX + module.removeprefix(PACKAGE + ".").replace(".", "_") + ".py"


def source_file(package_dir: Path, module: str) -> Path:
    path = package_dir.parent / (module.replace(".", "/") + ".py")
    return path if path.is_file() else package_dir.parent / module.replace(".", "/") / "__init__.py"


def is_module(package_dir: Path, module: str) -> bool:
    base = package_dir.parent / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
