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
# Preemption: SIGTERM or SIGHUP (to this script, to the phase's pretrain.sh or to the whole job) stops the
# running phase with a checkpoint and ends the curriculum with exit 0 without starting the next
# phase; launch it again to resume that phase.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi
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

# One phase's launch in the background, so that a SIGTERM here reaches it as a graceful stop. A
# SIGTERM between phases (or while the plan is made) starts no further phase.
stop_asked=0
trap 'stop_asked=1' TERM HUP
run_phase() {
  "$@" &
  child=$!
  trap 'stop_asked=1; kill -TERM "$child" 2>/dev/null || true' TERM HUP
  [ "$stop_asked" = 1 ] && kill -TERM "$child" 2>/dev/null  # asked just before the phase started
  while :; do
    set +e; wait "$child"; rc=$?; set -e
    kill -0 "$child" 2>/dev/null || break  # a wait cut short by the trap: the phase still runs
  done
  trap 'stop_asked=1' TERM HUP
  return "$rc"
}

plan="$("$PYTHON" -m implicit_megatron.train.curriculum "$config" "$@")"
while IFS=$'\t' read -r -u 3 name status nodes procs hostfile outdir; do
  if [ "$status" = "done" ]; then
    echo "[curriculum] phase $name: finished, skipped"
    continue
  fi
  if [ "$stop_asked" = 1 ]; then
    echo "[curriculum] stopped by SIGTERM before phase $name; launch the curriculum again to resume it"
    exit 0
  fi
  settings=()
  [ "$nodes" != - ] && settings+=("NUM_NODES=$nodes")
  [ "$procs" != - ] && settings+=("GPUS_PER_NODE=$procs" "NPROC=$procs")
  [ "$hostfile" != - ] && settings+=("HOSTFILE=$hostfile")
  echo "[curriculum] phase $name: starting${settings[*]:+ with ${settings[*]}}"
  run_phase env ${settings[@]+"${settings[@]}"} bash launch/pretrain.sh "$config" "$@" "curriculum.run_phase=$name"
  if [ -f "$outdir/preempted.json" ]; then  # a graceful stop: pretrain.sh exited 0, the phase is not done
    echo "[curriculum] phase $name: stopped early with a checkpoint ($(cat "$outdir/preempted.json")); launch the curriculum again to resume it"
    exit 0
  fi
done 3<<< "$plan"  # fd 3: the launches may read standard input
echo "[curriculum] every phase of $config is finished"
