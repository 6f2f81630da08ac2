#!/usr/bin/env bash
# ruff over the whole tree (configured in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,eval
exec .venv/bin/python -m ruff check .
