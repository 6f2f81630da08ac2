#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up .venv (with the dev and eval extras)
# when needed, then runs pytest. Extra arguments go to pytest (e.g. -k config, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,eval
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q --durations=15 "$@"
