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
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ $# -lt 1 ]; then
  echo "usage: bash launch/curriculum.sh CONFIG [key=value ...]" >&2
  exit 2
fi
config="$1"
shift

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ] || ! python3 -c "import implicit_megatron, torch, deepspeed" 2>/dev/null; then
    bash scripts/setup.sh  # idempotent
    PYTHON="$root/.venv/bin/python"
  else
    PYTHON=python3  # a cluster image with the project installed
  fi
fi
export PYTHON

plan="$("$PYTHON" -m implicit_megatron.train.curriculum "$config" "$@")"
while IFS=$'\t' read -r -u 3 name status nodes procs hostfile; do
  if [ "$status" = done ]; then
    echo "[curriculum] phase $name: finished, skipped"
    continue
  fi
  settings=()
  [ "$nodes" != - ] && settings+=("NUM_NODES=$nodes")
  [ "$procs" != - ] && settings+=("GPUS_PER_NODE=$procs" "NPROC=$procs")
  [ "$hostfile" != - ] && settings+=("HOSTFILE=$hostfile")
  echo "[curriculum] phase $name: starting${settings[*]:+ with ${settings[*]}}"
  env ${settings[@]+"${settings[@]}"} bash launch/pretrain.sh "$config" "$@" "curriculum.run_phase=$name"
done 3<<< "$plan"  # fd 3: the launches may read standard input
echo "[curriculum] every phase of $config is finished"
