#!/usr/bin/env bash
# Idempotent set-up of .venv for this checkout.
#   bash scripts/setup.sh [EXTRAS]       e.g. EXTRAS=dev or dev,eval (the extras of pyproject.toml)
# The extra `kernels` (the suite's kernel tier) adds triton and mamba-ssm without its CUDA build; where
# they do not install, the set-up goes on and the tier's tests are skipped, each saying why.
# Where a torch build is already importable (cluster images, ROCm builds) the venv
# sees the system packages and reuses it; otherwise scripts/install_torch.sh installs
# torch==2.13.0 first and says which build arrived (TORCH_INDEX_URL picks the index:
# pip's public default serves the CUDA build on Linux x86_64), and a constraints file
# holds it so that no dependency replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
known="$("$py" - <<'EXTRAS'
import re  # the keys of [project.optional-dependencies] (tomllib is Python 3.11's; 3.10 reads the lines)
try:
    import tomllib
    print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]))
except ModuleNotFoundError:
    section = open("pyproject.toml").read().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    print(" ".join(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M)))
EXTRAS
)"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  echo "Extras: $known"
  exit 0
fi
if [ $# -gt 1 ]; then
  echo "setup.sh: one argument, the extras separated by commas (e.g. dev,eval); got $#" >&2
  exit 2
fi
extras="${1:-}"
IFS=, read -r -a wanted <<< "$extras"
for extra in "${wanted[@]+"${wanted[@]}"}"; do
  case " $known " in
    *" $extra "*) ;;
    *) printf 'setup.sh: unknown extra %q; the extras are: %s\n' "$extra" "$known" >&2; exit 2 ;;
  esac
done
venv=".venv"
stamp="$venv/.installed-${extras:-base}"

up_to_date() { [ -f "$1" ] && [ "$1" -nt pyproject.toml ]; }
if up_to_date "$stamp"; then
  exit 0
fi
if [ -z "$extras" ]; then  # any earlier install (with extras) holds the base dependencies
  for other in "$venv"/.installed-*; do
    if up_to_date "$other"; then exit 0; fi
  done
fi

if [ ! -x "$venv/bin/python" ]; then
  if "$py" -W ignore -c "import torch" 2>/dev/null; then
    echo "[setup] reusing the system torch: $("$py" -W ignore -c 'import torch; print(torch.__version__)')"
    "$py" -m venv --system-site-packages "$venv"
  else
    "$py" -m venv "$venv"
  fi
fi
vpy="$venv/bin/python"
"$vpy" -m pip install -q --upgrade pip setuptools wheel

constraints="$venv/constraints.txt"
if ! "$vpy" -W ignore -c "import torch" 2>/dev/null; then
  bash scripts/install_torch.sh "$vpy"
fi
"$vpy" -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" > "$constraints"

others=()
kernel_tier=false
for extra in "${wanted[@]+"${wanted[@]}"}"; do
  if [ "$extra" = kernels ]; then kernel_tier=true; else others+=("$extra"); fi
done
spec="."
[ ${#others[@]} -gt 0 ] && spec=".[$(IFS=,; echo "${others[*]}")]"
echo "[setup] installing implicit-megatron $spec (torch held at $(cat "$constraints"))"
# setuptools' editable-install notice (a 10-line banner on every set-up) says nothing about this project
PIP_CONSTRAINT="$constraints" PYTHONWARNINGS="ignore:Editable installation" "$vpy" -m pip install -q -e "$spec"

# mamba-ssm's own metadata requires CUDA-only packages and its build looks for a CUDA wheel: installed
# without its dependencies (the `kernels` extra lists the ones its Triton kernels import) and with its
# CUDA build skipped, from source, as pure Python.
install_kernel_tier() {
  local version
  version="$(sed -n 's/^kernel-tier-mamba-ssm = "\(.*\)"/\1/p' pyproject.toml)"
  PIP_CONSTRAINT="$constraints" PYTHONWARNINGS="ignore:Editable installation" "$vpy" -m pip install -q -e ".[kernels]" \
    || return 1
  if [ "$("$vpy" -c 'import importlib.metadata as m; print(m.version("mamba_ssm"))' 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE PIP_CONSTRAINT="$constraints" \
    "$vpy" -m pip install -q --no-deps --no-build-isolation "mamba-ssm==$version"
}
if $kernel_tier && ! install_kernel_tier; then
  echo "[setup] triton or mamba-ssm did not install here: the kernel tier (tests/kernels/) will be skipped" >&2
  exit 0  # no stamp: the next set-up tries again
fi
touch "$stamp"
echo "[setup] done: $venv"
