#!/usr/bin/env bash
# ruff over the tree and mypy over the packages (configured in pyproject.toml), then the cluster images' checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,eval
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
exec .venv/bin/python tools/dev/check_dockerfiles.py
