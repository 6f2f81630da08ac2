#!/usr/bin/env bash
# The acceptance run of a new GPU node (tools/node/gpu_acceptance.py), with the GPU kit set up first
# where a checkout carries one (.gpu-kit/device-setup.sh: prebuilt wheels for a machine without a
# package index). Every argument goes to the Python driver; --help prints its manual.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ -f .gpu-kit/device-setup.sh ]; then
  # shellcheck disable=SC1091
  . .gpu-kit/device-setup.sh
fi
exec "${PYTHON:-python3}" tools/node/gpu_acceptance.py "$@"
