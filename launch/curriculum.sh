#!/usr/bin/env bash
# Run a curriculum phase after phase:  bash launch/curriculum.sh CONFIG [key=value ...]
#
# Each phase of CONFIG's curriculum is a launch of its own (launch/pretrain.sh CONFIG ...
# curriculum.run_phase=NAME), on the nodes, processes and ZeRO stage the phase names
# (curriculum.phases[i].launch.{num_nodes,processes_per_node,hostfile}, .zero_stage,
# .micro_batch_size), else on what the environment says (NUM_NODES, GPUS_PER_NODE / NPROC,
# HOSTFILE; see launch/pretrain.sh). Every phase starts from the run's latest checkpoint: the
# previous phase's last one (a handoff: weights always; optimizer and data position unless
# checkpoint.load_optimizer / load_data_state say no; step and LR schedule continue), or its own
# (a resume). A changed world size or ZeRO stage is handled by the training entry. Run it again
# after a failure: finished phases are skipped, an unfinished one resumes.
# Preemption: SIGTERM, SIGHUP or SIGUSR1 (to this script or to the whole job) stops the
# running phase with a checkpoint and ends the curriculum with exit 0 without starting the next
# phase; launch it again to resume that phase. `--plan` as the first argument prints the plan.
# Ctrl-C: as launch/pretrain.sh's.
# The phases run from implicit_megatron/launch/curriculum.py, each a launch as launch/pretrain.sh's.
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
if [ $# -lt 1 ]; then
  echo "usage: bash launch/curriculum.sh CONFIG [key=value ...]" >&2
  exit 2
fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ] || ! python3 -c "import implicit_megatron, torch, deepspeed" 2>/dev/null; then
    bash scripts/setup.sh  # idempotent
    PYTHON="$root/.venv/bin/python"
  else
    PYTHON=python3  # a cluster image with the project installed
  fi
fi
export PYTHON
exec "$PYTHON" -m implicit_megatron.launch.curriculum "$@"
