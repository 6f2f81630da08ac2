"""Static checks of the cluster images, Dockerfile (ROCm) and docker/cuda.Dockerfile (NVIDIA).

    python tools/check_dockerfiles.py [DOCKERFILE ...] [--pyproject pyproject.toml] [--no-hadolint]

The images take hours to build, on machines CI does not have, so their costly mistakes are caught here:
a base image not pinned to a tag, a pip install of torch (it would replace the image's GPU build), a kernel
built in an isolated environment (against another torch) or without the GPU architecture set (it would
target the build machine's GPU, which a build has not), root at run time, an ARG nothing reads, a pinned
version that contradicts pyproject.toml, and a kernel of pyproject's `gpu` extra that an image leaves out.
hadolint also runs when installed (on PATH or beside this Python; the dev extra brings it).
Prints one `FILE:LINE: message` per problem and exits 1 if there is any, else 0.
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    from dockerfile_parse import DockerfileParser
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
except ModuleNotFoundError as missing:
    sys.exit(f"check_dockerfiles: {missing.name} is missing; install the dev extra (bash scripts/setup.sh dev)")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILES = ("Dockerfile", "docker/cuda.Dockerfile")
# Packages that come with the base image's GPU build of torch: installing them from PyPI replaces it.
HELD = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"}
# Built against the installed torch besides the `gpu` extra (DeepSpeed's setup.py imports torch).
BUILT_AGAINST_TORCH = {"deepspeed"}
# The architectures of the clusters (MI300X; A100 and H100) that each variable must name.
ARCH_TARGETS = {
    "rocm": {"PYTORCH_ROCM_ARCH": ["gfx942"], "HIP_ARCHITECTURES": ["gfx942"], "GPU_ARCHS": ["gfx942"]},
    "cuda": {"TORCH_CUDA_ARCH_LIST": ["8.0", "9.0"]},
}
PIP_VALUE_OPTIONS = {
    "-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
    "-t", "--target", "--prefix", "--root", "--src", "-C", "--config-settings", "--global-option",
    "--no-binary", "--only-binary", "--platform", "--python-version", "--implementation", "--abi",
    "--upgrade-strategy", "--progress-bar", "--log", "--cache-dir", "--trusted-host", "--proxy", "--retries",
    "--timeout", "--exists-action", "--cert", "--client-cert", "--report", "--root-user-action", "--python",
}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::?([-+])([^}]*))?\}|(\w+))")


@dataclass
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Install:
    """One `pip install` command: its physical line, options and package arguments."""

    line: int
    options: list[str]
    packages: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Project:
    """What pyproject.toml says about the packages the images install."""

    requirements: dict[str, list[tuple[str, Requirement]]]  # name -> [(where, requirement)]
    gpu: list[str]

    @classmethod
    def load(cls, path: Path) -> Project:
        data = tomllib.loads(path.read_text())["project"]
        groups = {"dependencies": data.get("dependencies", [])}
        groups.update({f"extra {k}": v for k, v in data.get("optional-dependencies", {}).items()})
        requirements: dict[str, list[tuple[str, Requirement]]] = {}
        for where, specs in groups.items():
            for spec in specs:
                req = Requirement(spec)
                requirements.setdefault(canonicalize_name(req.name), []).append((where, req))
        gpu = [canonicalize_name(Requirement(s).name) for s in data.get("optional-dependencies", {}).get("gpu", [])]
        return cls(requirements, gpu)


def substitute(text: str, variables: dict[str, str]) -> str:
    """Docker's ${NAME}, $NAME and ${NAME:-default} expansion; unknown names are left as they are."""

    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        if name in variables:
            return m.group(3) if m.group(2) == "+" else variables[name]
        return m.group(3) if m.group(2) == "-" else m.group(0)

    return VARIABLE.sub(one, text)


def key_values(value: str) -> list[tuple[str, str | None]]:
    """The NAME=value pairs of an ARG or ENV instruction (also ENV's old `ENV NAME value` form)."""
    words = shlex.split(value, posix=True)
    if words and "=" not in words[0] and len(words) > 1:
        return [(words[0], " ".join(words[1:]))]
    return [(w.split("=", 1)[0], w.split("=", 1)[1]) if "=" in w else (w, None) for w in words]


def pip_installs(command: str, first_line: int, lines: list[str], last_line: int) -> list[Install]:
    """The pip install commands of a RUN, each with the physical line that names its first package."""
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        return []
    installs = []
    for simple in _split_commands(words):
        env = {}
        while simple and re.fullmatch(r"\w+=.*", simple[0]):
            name, value = simple.pop(0).split("=", 1)
            env[name] = value
        rest = _after_pip_install(simple)
        if rest is None:
            continue
        options, packages, take_value = [], [], False
        for word in rest:
            if take_value:
                take_value = False
                if options[-1] in ("-e", "--editable"):
                    packages.append(word)
                continue
            if word.startswith("-"):
                options.append(word)
                take_value = word in PIP_VALUE_OPTIONS or word in ("-e", "--editable")
            else:
                packages.append(word)
        needle = re.split(r"[\s=<>!~@\[;]", packages[0], maxsplit=1)[0] if packages else "install"
        line = next((n for n in range(first_line, last_line + 1) if needle in lines[n - 1]), first_line)
        installs.append(Install(line, options, packages, env))
    return installs


def _split_commands(words: list[str]) -> list[list[str]]:
    commands, current = [], []
    for word in words:
        if word in ("&&", "||", ";", "|", "(", ")") or word.endswith(";"):
            if word.endswith(";") and word != ";":
                current.append(word[:-1])
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    return [c for c in commands if c]


def _after_pip_install(words: list[str]) -> list[str] | None:
    for i, word in enumerate(words):
        base = word.rsplit("/", 1)[-1]
        if re.fullmatch(r"pip[\d.]*", base) and words[i + 1:i + 2] == ["install"]:
            return words[i + 2:]
        if re.fullmatch(r"python[\d.]*", base) and words[i + 1:i + 4] == ["-m", "pip", "install"]:
            return words[i + 4:]
        if base == "uv" and words[i + 1:i + 3] == ["pip", "install"]:
            return words[i + 3:]
    return None


def parse_requirement(word: str) -> Requirement | None:
    """A package argument as a requirement, or None for a local path or plain URL."""
    if word.startswith((".", "/", "~")) or re.match(r"^\w+\+?\w*://", word):
        return None
    try:
        return Requirement(word)
    except InvalidRequirement:
        return None


class Checker:
    """Checks one Dockerfile; `problems` collects what is wrong with it."""

    def __init__(self, path: Path, project: Project, shown: str) -> None:
        self.path, self.project, self.shown = path, project, shown
        text = path.read_text()
        self.lines = text.splitlines()
        parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))  # in memory: never opens a path to write
        self.instructions = [i for i in parser.structure if i["instruction"] != "COMMENT"]
        self.problems: list[Problem] = []

    def problem(self, line: int, message: str) -> None:
        self.problems.append(Problem(self.shown, line, message))

    def run(self) -> list[Problem]:
        if not any(i["instruction"] == "FROM" for i in self.instructions):
            self.problem(1, "no FROM instruction")
            return self.problems
        self.walk()
        self.check_args_used()
        self.check_user()
        return self.problems

    def walk(self) -> None:
        """Goes through the instructions in order, with the variables each one sees."""
        variables: dict[str, str] = {}  # ARG defaults and ENV values seen so far
        in_effect: dict[str, str] = {}  # what a RUN of the current stage sees in its environment
        stages: set[str] = set()
        flavour = None
        installed: dict[str, int] = {}
        pins: dict[tuple[str, str], int] = {}
        project_line = arch_checked = None
        final_from = 1
        for instr in self.instructions:
            kind, line = instr["instruction"], instr["startline"] + 1
            value = instr["value"]
            if kind == "FROM":
                final_from, in_effect = line, {}
                image, alias = self.check_from(value, variables, stages, line)
                if alias:
                    stages.add(alias)
                if image and "rocm" in image:
                    flavour = "rocm"
                elif image and flavour is None and image not in stages:
                    flavour = "cuda"
            elif kind in ("ARG", "ENV"):
                for name, raw in key_values(value):
                    if raw is None:
                        if name in variables:
                            in_effect[name] = variables[name]
                        continue
                    variables[name] = in_effect[name] = substitute(raw, variables)
                    if kind == "ARG" and name.endswith("_VERSION"):
                        package = canonicalize_name(name[: -len("_VERSION")].replace("_", "-"))
                        if package in self.project.requirements:
                            pins.setdefault((package, variables[name]), line)
            elif kind == "RUN":
                command = substitute(value, variables)
                for install in pip_installs(command, line, self.lines, instr["endline"] + 1):
                    needs_arch = self.check_install(install, installed, pins)
                    if any(p.startswith(".") for p in install.packages):
                        project_line = install.line
                    if needs_arch and arch_checked is None:
                        arch_checked = install.line
                        self.check_arch(flavour or "cuda", {**in_effect, **install.env}, install.line)
        for package, version in sorted(pins):
            self.check_pin(package, version, pins[(package, version)])
        for package in self.project.gpu:
            if package not in installed:
                self.problem(final_from, f"the image does not install {package} (pyproject.toml's gpu extra)")
        if project_line is None:
            self.problem(final_from, "the image does not install the project (pip install \".[eval]\")")

    def check_from(self, value: str, variables: dict[str, str], stages: set[str], line: int):
        words = [w for w in value.split() if not w.startswith("--")]
        if not words:
            self.problem(line, "FROM without an image")
            return None, None
        image = substitute(words[0], variables)
        alias = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
        if image in stages or image == "scratch":
            return image, alias
        if "$" in image:
            self.problem(line, f"base image {words[0]} does not resolve: give its ARG a default")
        elif "@sha256:" in image:
            pass
        elif ":" not in image.rsplit("/", 1)[-1]:
            self.problem(line, f"base image {image} is not pinned: name a tag (or a digest)")
        elif image.rsplit(":", 1)[1] == "latest":
            self.problem(line, f"base image {image} is pinned to `latest`, which moves: name a release tag")
        return image, alias

    def check_install(self, install: Install, installed: dict[str, int], pins: dict) -> bool:
        """Checks one pip install; returns whether it builds something against torch."""
        builds = False
        for word in install.packages:
            req = parse_requirement(word)
            if req is None:
                continue
            name = canonicalize_name(req.name)
            if name in HELD:
                self.problem(install.line, f"pip install of {req.name}: it would replace the base image's GPU "
                                           "build (keep the image's)")
            if name in self.project.gpu:
                installed.setdefault(name, install.line)
            if name in self.project.gpu or name in BUILT_AGAINST_TORCH:
                builds = True
                if "--no-build-isolation" not in install.options:
                    self.problem(install.line, f"{req.name} must be installed with --no-build-isolation, "
                                               "to build against the image's torch")
            exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if exact and name in self.project.requirements:
                pins.setdefault((name, exact[0]), install.line)
        return builds

    def check_arch(self, flavour: str, environment: dict[str, str], line: int) -> None:
        for name, targets in ARCH_TARGETS[flavour].items():
            value = environment.get(name)
            if not value:
                self.problem(line, f"{name} is not set for this GPU build (ENV or ARG before it): it would "
                                   "target the build machine's GPU")
                continue
            archs = {a.split("+")[0] for a in re.split(r"[;,\s]+", value) if a}
            missing = [t for t in targets if t not in archs]
            if missing:
                self.problem(line, f"{name}={value} leaves out {', '.join(missing)} (the clusters' GPUs)")

    def check_pin(self, package: str, version: str, line: int) -> None:
        try:
            parsed = Version(version)
        except InvalidVersion:
            self.problem(line, f"{package} is pinned to {version!r}, which is not a version")
            return
        for where, req in self.project.requirements.get(package, []):
            if req.specifier and not req.specifier.contains(parsed, prereleases=True):
                self.problem(line, f"{package} {version} contradicts pyproject.toml's {req} ({where})")

    def check_args_used(self) -> None:
        for i, instr in enumerate(self.instructions):
            if instr["instruction"] != "ARG":
                continue
            for name, _ in key_values(instr["value"]):
                use = re.compile(rf"\$\{{?{name}\b")
                later = self.instructions[i + 1:]
                if not any(use.search(j["value"]) for j in later) and not any(
                        j["instruction"] == "ARG" and name in dict(key_values(j["value"])) for j in later):
                    self.problem(instr["startline"] + 1, f"ARG {name} is never used")

    def check_user(self) -> None:
        start = max(i for i, j in enumerate(self.instructions) if j["instruction"] == "FROM")
        final = self.instructions[start:]
        starts = [j for j in final if j["instruction"] in ("CMD", "ENTRYPOINT")]
        users = [j for j in final if j["instruction"] == "USER"]
        if not starts:
            self.problem(len(self.lines), "no CMD or ENTRYPOINT in the final stage")
        if not users:
            line = starts[0]["startline"] + 1 if starts else len(self.lines)
            self.problem(line, "the image runs as root: add a USER (not root) before CMD/ENTRYPOINT")
            return
        variables = {}
        for j in self.instructions:
            if j["instruction"] in ("ARG", "ENV"):
                variables.update({k: substitute(v, variables) for k, v in key_values(j["value"]) if v is not None})
        user = substitute(users[-1]["value"], variables).split(":")[0]
        if user in ("root", "0"):
            self.problem(users[-1]["startline"] + 1, f"USER {user}: the image must run as a non-root user")


def find_hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def hadolint(hadolint_bin: str, path: Path, shown: str) -> list[str]:
    """hadolint's findings at warning level or above (inline `# hadolint ignore=` comments apply)."""
    result = subprocess.run([hadolint_bin, "--no-color", "--failure-threshold", "warning", "-"],
                            input=path.read_text(), capture_output=True, text=True)
    if result.returncode == 0:
        return []
    found = [re.sub(r"^-:(\d+) ", lambda m: f"{shown}:{m.group(1)}: hadolint ", line)
             for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return [line for line in found if " info: " not in line and " style: " not in line] or found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help=f"default: {', '.join(DEFAULT_FILES)}")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--no-hadolint", action="store_true", help="only the structural checks")
    args = parser.parse_args(argv)
    files = args.files or [ROOT / f for f in DEFAULT_FILES]
    project = Project.load(args.pyproject)
    hadolint_bin = None if args.no_hadolint else find_hadolint()

    messages: list[str] = []
    for path in files:
        shown = _shown(path)
        if not path.is_file():
            messages.append(f"{shown}:1: no such file")
            continue
        found = [str(p) for p in Checker(path, project, shown).run()]
        if hadolint_bin:
            found += hadolint(hadolint_bin, path, shown)
        messages += sorted(found, key=lambda m: int(re.match(r"\d*", m[len(shown) + 1:]).group() or 0))
    for message in messages:
        print(message)
    names = ", ".join(_shown(p) for p in files)
    linters = "hadolint and structural checks" if hadolint_bin else "structural checks; hadolint not found"
    if messages:
        print(f"{len(messages)} problem(s) in {names}", file=sys.stderr)
        return 1
    print(f"ok: {names} ({linters}; pins agree with {_shown(args.pyproject)})")
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
