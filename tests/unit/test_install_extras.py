"""What `scripts/setup.sh eval` installs holds everything the README's transformers examples and
lm-eval's `hf` model import: each module they import at the top is in the base install, the `eval`
extra, or what those require in turn (read from the installed packages' own metadata)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from support.processes import ROOT

try:
    import tomllib
except ImportError:  # Python 3.10: the dev extra's tomli
    import tomli as tomllib


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, set[str], str]:
    """(name, extras, marker) of one requirement string."""
    match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?[^;]*(?:;(.*))?", requirement)
    extras = {canonical(e) for e in (match.group(2) or "").split(",") if e.strip()}
    return canonical(match.group(1)), extras, (match.group(3) or "").strip()


def closure(requirements: list[str]) -> set[str]:
    """Every distribution the requirements pull in, extras followed, from installed metadata."""
    seen, todo = set(), [parse(r) for r in requirements]
    while todo:
        name, extras, marker = todo.pop()
        if marker and "extra" not in marker and "sys_platform" not in marker and "python_version" not in marker:
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            own = requires(name) or []
        except PackageNotFoundError:
            continue
        for requirement in own:
            child, child_extras, child_marker = parse(requirement)
            wanted = re.findall(r"""extra\s*==\s*["']([^"']+)["']""", child_marker)
            if wanted and not any(canonical(w) in extras for w in wanted):
                continue
            if not wanted and "python_version" in child_marker:
                continue
            todo.append((child, child_extras, ""))
    return seen


def installed_by_eval() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return closure(project["dependencies"] + project["optional-dependencies"]["eval"])


def top_level_imports(source: str) -> set[str]:
    modules = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"implicit_megatron"}


def distributions_of(modules: set[str]) -> dict[str, str]:
    names = packages_distributions()
    return {module: canonical(names[module][0]) for module in modules}


def readme_transformers_examples() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [b for page in pages for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
    return [block for block in blocks if "transformers" in block]


def test_the_eval_extra_holds_what_the_readme_transformers_examples_import():
    examples = readme_transformers_examples()
    assert examples, "README.md has no python example using transformers"
    have = installed_by_eval()
    for example in examples:
        for module, distribution in distributions_of(top_level_imports(example)).items():
            assert distribution in have, f"the README imports {module} ({distribution}), which `eval` does not install"


def test_the_eval_extra_holds_what_lm_evals_hf_model_imports():
    hf = pytest.importorskip("lm_eval.models.huggingface")
    have = installed_by_eval()
    modules = top_level_imports(Path(hf.__file__).read_text()) - {"lm_eval"}
    assert "transformers" in modules and "accelerate" in modules
    for module, distribution in distributions_of(modules).items():
        assert distribution in have, f"lm-eval's hf model imports {module} ({distribution}), which `eval` lacks"
