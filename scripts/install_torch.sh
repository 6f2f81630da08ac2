#!/usr/bin/env bash
# Installs torch into a virtual environment that has none, and says which build arrived.
#   bash scripts/install_torch.sh VENV_PYTHON
# TORCH_WHEEL      a torch wheel file to install (a cluster's own build, or a wheel kept offline)
# TORCH_INDEX_URL  the package index torch comes from: your mirror, or the CPU-only index that
#                  PyTorch's install page names. Unset: pip's configured index, whose public default
#                  serves the CUDA build on Linux x86_64 (several GB of CUDA libraries).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi
if [ $# -ne 1 ]; then
  echo "install_torch.sh: one argument, the virtual environment's python; got $#" >&2
  exit 2
fi
vpy="$1"
wanted="torch==2.13.0"
if [ -n "${TORCH_WHEEL:-}" ]; then
  echo "[setup] installing torch from TORCH_WHEEL=$TORCH_WHEEL"
  "$vpy" -m pip install -q "$TORCH_WHEEL"
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  echo "[setup] installing $wanted from TORCH_INDEX_URL=$TORCH_INDEX_URL"
  "$vpy" -m pip install -q --index-url "$TORCH_INDEX_URL" "$wanted"
else
  echo "[setup] installing $wanted from pip's configured index (the public one serves the CUDA build on" \
       "Linux x86_64: for the CPU-only build set TORCH_INDEX_URL; scripts/install_torch.sh --help)"
  "$vpy" -m pip install -q "$wanted"
fi
# Which build arrived, and where its CUDA libraries went (-W ignore: torch warns when NumPy is not
# installed yet, which the project's own install brings next).
"$vpy" -W ignore - <<'BUILD'
import sysconfig
from pathlib import Path

import torch

if torch.version.hip:
    build = f"the ROCm {torch.version.hip} build"
elif torch.version.cuda:
    build = f"the CUDA {torch.version.cuda} build"
else:
    build = "the CPU build"
libraries = Path(sysconfig.get_paths()["purelib"]) / "nvidia"  # CUDA's runtime libraries, as packages of their own
size = sum(f.stat().st_size for f in libraries.rglob("*") if f.is_file()) if libraries.is_dir() else 0
line = f"[setup] torch {torch.__version__}: {build}"
if size:
    line += f", with {size / 2**30:.1f} GiB of CUDA libraries in {libraries}" if size >= 2**30 else \
        f", with {size / 2**20:.0f} MiB of CUDA libraries in {libraries}"
if build != "the CPU build" and not torch.cuda.is_available():
    line += ("; no GPU is visible here: for the CPU-only build, remove the virtual environment and run the set-up "
             "again with TORCH_INDEX_URL set to the CPU-only index PyTorch's install page names")
print(line)
BUILD
