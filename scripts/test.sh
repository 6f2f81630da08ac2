#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up .venv (with the dev and eval extras)
# when needed, then runs pytest. Extra arguments go to pytest (e.g. -k config, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,eval
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two workers (pytest-xdist): in-process tests use one thread, and a launch's ranks leave a core idle
# while they start, so two at a time take about 25 minutes on 2 cores where one at a time took 40.
# `-n 0` runs them one at a time, `-n 8` on a bigger machine (each worker may start 2 training processes).
exec .venv/bin/python -m pytest -q --durations=15 -n 2 --dist worksteal "$@"
