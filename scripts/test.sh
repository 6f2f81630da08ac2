#!/usr/bin/env bash
# The test suite, from a fresh clone: sets up .venv (with the dev, eval and kernels extras) when needed,
# then runs pytest. Extra arguments go to pytest (e.g. -k config, -x).
#   bash scripts/test.sh           everything, as CI runs it
#   bash scripts/test.sh --quick   the edit loop's tier: no test that starts a process, trains for long
#                                  or runs mamba_ssm's kernels (the kernel tier: pytest -m kernels)
#   bash scripts/test.sh --help    this, before any set-up
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  echo "pytest's own options: .venv/bin/python -m pytest --help (once a first run has set up .venv)"
  exit 0
fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,eval,kernels
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Compiled modules are cached (__pycache__, ignored by git): every process the suite starts reads
# them instead of compiling the package again, even where the environment asks for no caches.
unset PYTHONDONTWRITEBYTECODE
# Three workers (pytest-xdist) on 2 cores: many tests wait (on a stop, a timeout, a daemon, a node),
# and with two workers the cores were idle a third of the time. The quick tier never waits: two
# workers, one a core (a third only adds its start-up: 191 s against 201 s here). Tests start longest
# first (tests/conftest.py). `-n 0` runs them one at a time, `-n 8` on a bigger machine (each worker
# may start 2 training processes).
workers=3
for arg in "$@"; do [ "$arg" = --quick ] && workers=2; done
exec .venv/bin/python -m pytest -q --durations=30 -n "$workers" --dist worksteal "$@"
