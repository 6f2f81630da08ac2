#!/usr/bin/env bash
# Launch pretraining:  bash launch/pretrain.sh [CONFIG] [key=value ...]
#
# With no CONFIG it runs configs/quickstart.yaml (the bundled corpus is tokenized on first use).
#   GPUs:   the DeepSpeed launcher, GPUS_PER_NODE processes per node (default: all visible GPUs),
#           NUM_NODES nodes (default 1; with HOSTFILE, the hosts listed there), MASTER_ADDR/PORT.
#   No GPU: NPROC CPU processes on gloo (default 1) through torchrun; with HOSTFILE or NUM_NODES, the
#           DeepSpeed launcher as with GPUs (a hostfile's slots are CPU processes).
#   Already started by a launcher (RANK and LOCAL_RANK set, e.g. `deepspeed --no_python --no_local_rank
#   launch/pretrain.sh CONFIG`, torchrun, or one `srun` task per GPU, whose SLURM_* variables are
#   mapped): runs this rank directly, without set-up (run scripts/setup.sh once beforehand). RANK or
#   LOCAL_RANK without the rest a launcher sets (WORLD_SIZE, MASTER_ADDR/PORT), or a SLURM batch
#   script of several tasks run without srun, is refused naming the variables.
# Other settings: LAUNCHER_ARGS (the launcher's own options that the launch lets through, each value
#   checked: docs/cluster.md), OMP_NUM_THREADS (default: cores / processes),
#   PYTHON (the interpreter; default: .venv, set up on first use, or an installed package's python),
#   GPU_DEVICE_NODES (where to look for GPUs before asking torch; default /dev/nvidia* /dev/kfd /dev/dxg).
# Ports: one node without MASTER_PORT takes a free port (two runs on one machine do not collide);
#   several nodes use MASTER_PORT or 29500 on every node.
# Preemption: SIGTERM or SIGUSR1 to this script (or to the whole job), SIGHUP (its terminal closed) or
#   Ctrl-C makes the ranks finish their step, save a checkpoint and stop; the script then exits 0, as
#   after a finished run, and <output_dir>/run-end.json says `stopped`. A second Ctrl-C stops at once
#   (exit 130), SIGQUIT (Ctrl-\) too (exit 131). Anything else exits non-zero. (The stop signals: implicit_megatron/run_control.py.)
# This script finds or sets up the Python environment and hands over to the launch itself,
# implicit_megatron/launch/ (python -m implicit_megatron.launch CONFIG ...: the checks, the world, the
# launcher and the graceful stop).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# A stop asked while this sets up is the launch's: it ends before any rank starts. The stop signals
# and the variable that hands one on are implicit_megatron/run_control.py's (standard library only).
eval "$("${PYTHON:-python3}" -S -m implicit_megatron.run_control --shell-traps 2> /dev/null || true)"
rank=""  # a rank already (started by a launcher, or one srun task of several): no set-up here
if [ -n "${RANK:-}" ] && [ -n "${LOCAL_RANK:-}" ]; then rank=1; fi
if [ -n "${SLURM_PROCID:-}" ] && [ "${SLURM_NTASKS:-1}" != 1 ]; then rank=1; fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then
    PYTHON="$root/.venv/bin/python"
  elif python3 -c "import implicit_megatron, torch, deepspeed" 2>/dev/null; then
    PYTHON=python3  # a cluster image with the project installed
  elif [ -n "$rank" ]; then
    echo "pretrain.sh: no environment on this rank; run 'bash scripts/setup.sh' once before launching" >&2
    exit 2
  fi
fi
if [ -z "$rank" ] && { [ -z "${PYTHON:-}" ] || [ "$PYTHON" = "$root/.venv/bin/python" ]; }; then
  bash scripts/setup.sh  # idempotent: a no-op once .venv is up to date
  PYTHON="$root/.venv/bin/python"
fi
export PYTHON
exec "$PYTHON" -m implicit_megatron.launch "$@"
