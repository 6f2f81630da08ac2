"""scripts/install_torch.sh says where torch comes from and which build arrived, with the way to the
CPU-only build where a GPU build lands on a machine without a GPU. Stand-in torch wheels (a few
lines each, one requiring a CUDA library package) in a local index: the real builds are gigabytes."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.processes import ROOT

pytestmark = pytest.mark.processes

GPU_BUILD = '__version__ = "2.13.0+cu128"\nclass version:\n    cuda, hip = "12.8", None\n' \
            'class cuda:\n    is_available = staticmethod(lambda: False)\n'
CPU_BUILD = GPU_BUILD.replace("+cu128", "+cpu").replace('"12.8"', "None")


def wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel as pip installs it (RECORD without hashes: pip rewrites it)."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                + "".join(f"Requires-Dist: {r}\n" for r in requires),
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    everything = {**files, **{k: v.encode() for k, v in meta.items()}}
    everything[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in [*everything, f"{info}/RECORD"]).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, data in everything.items():
            archive.writestr(name_in, data)
    # the project's page of a simple index: a link per file
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(folder.glob("*.whl")))
    (folder / "index.html").write_text(f"<html><body>{links}</body></html>")
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """A package index (one folder per project) holding a CUDA torch and its CUDA library package."""
    root = tmp_path_factory.mktemp("index")
    wheel(root / "torch", "torch", "2.13.0", {"torch/__init__.py": GPU_BUILD.encode()},
          requires=("nvidia-cublas-cu12",))
    wheel(root / "nvidia-cublas-cu12", "nvidia-cublas-cu12", "12.8.0",
          {"nvidia/cublas/lib/libcublas.so.12": b"\0" * 3 * 2**20})
    return root


def install(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # this machine's own index settings
    return subprocess.run(["bash", "scripts/install_torch.sh", str(tmp_path / "venv/bin/python")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**clean, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env})


def test_the_default_index_names_the_build_its_cuda_libraries_and_the_way_to_the_cpu_build(index, tmp_path):
    result = install(tmp_path, PIP_INDEX_URL=index.as_uri())
    assert result.returncode == 0 and result.stderr == "", result.stderr
    said = result.stdout.splitlines()
    assert said[0] == ("[setup] installing torch==2.13.0 from pip's configured index (the public one serves the CUDA "
                       "build on Linux x86_64: for the CPU-only build set TORCH_INDEX_URL; scripts/install_torch.sh "
                       "--help)")
    libraries = tmp_path / f"venv/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages/nvidia"
    assert said[1] == (f"[setup] torch 2.13.0+cu128: the CUDA 12.8 build, with 3 MiB of CUDA libraries in {libraries}; "
                       "no GPU is visible here: for the CPU-only build, remove the virtual environment and run the "
                       "set-up again with TORCH_INDEX_URL set to the CPU-only index PyTorch's install page names")
    assert len(said) == 2


def test_a_named_index_or_wheel_is_said_and_a_cpu_build_is_called_one(index, tmp_path):
    named = install(tmp_path / "named", TORCH_INDEX_URL=index.as_uri())
    assert named.returncode == 0 and named.stdout.splitlines()[0] == \
        f"[setup] installing torch==2.13.0 from TORCH_INDEX_URL={index.as_uri()}", named.stderr
    cpu = wheel(tmp_path / "wheels", "torch", "2.13.0+cpu", {"torch/__init__.py": CPU_BUILD.encode()})
    result = install(tmp_path / "wheel", TORCH_WHEEL=str(cpu))
    assert result.returncode == 0 and result.stdout.splitlines() == [
        f"[setup] installing torch from TORCH_WHEEL={cpu}", "[setup] torch 2.13.0+cpu: the CPU build"], result.stderr
