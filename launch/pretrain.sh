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
#   mapped): runs this rank directly, without set-up (run scripts/setup.sh once beforehand).
# Other settings: LAUNCHER_ARGS (extra launcher flags), OMP_NUM_THREADS (default: cores / processes),
#   PYTHON (the interpreter; default: .venv, set up on first use, or an installed package's python),
#   GPU_DEVICE_NODES (where to look for GPUs before asking torch; default /dev/nvidia* /dev/kfd /dev/dxg).
# Ports: one node without MASTER_PORT takes a free port (two runs on one machine do not collide);
#   several nodes use MASTER_PORT or 29500 on every node.
# Preemption: SIGTERM to this script (or to the whole job), SIGHUP (its terminal closed) or Ctrl-C makes
#   the ranks finish their step, save a checkpoint and stop; the script then exits 0, as after a
#   finished run. A second Ctrl-C stops at once (exit 130). Anything else exits non-zero.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -euo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
stop_asked=""  # until the ranks start: a stop asked now ends the launch before them
trap 'stop_asked=SIGTERM' TERM
trap 'stop_asked=SIGHUP' HUP

args=()
for arg in "$@"; do  # a launcher may add --local_rank=N; LOCAL_RANK in the environment says the same
  case "$arg" in --local_rank=*|--local-rank=*) ;; *) args+=("$arg") ;; esac
done
set -- "${args[@]+"${args[@]}"}"
config="${1:-configs/quickstart.yaml}"
[ $# -gt 0 ] && shift
export MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
# Values that reach $(( )), the launcher's command line or a remote shell are checked before use:
# bash evaluates a name or `a[$(...)]` inside arithmetic, and a remote shell runs what an address holds.
for var in NUM_NODES GPUS_PER_NODE NPROC MASTER_PORT; do
  case "${!var:-}" in
    *[!0-9]*) printf 'pretrain.sh: %s=%q is not a whole number\n' "$var" "${!var}" >&2; exit 2 ;;
  esac
done
case "${MASTER_ADDR:-}" in
  *[!A-Za-z0-9.:_-]*) printf 'pretrain.sh: MASTER_ADDR=%q is not a host name or address\n' "$MASTER_ADDR" >&2; exit 2 ;;
esac

# One task per GPU under SLURM (srun --ntasks-per-node=GPUS): each task is one rank.
if [ -z "${RANK:-}" ] && [ -n "${SLURM_PROCID:-}" ] && [ "${SLURM_NTASKS:-1}" -gt 1 ]; then
  export RANK="$SLURM_PROCID" LOCAL_RANK="${SLURM_LOCALID:-0}" WORLD_SIZE="$SLURM_NTASKS"
  export MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"
  export MASTER_PORT="${MASTER_PORT:-29500}"
fi

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then
    PYTHON="$root/.venv/bin/python"
  elif python3 -c "import implicit_megatron, torch, deepspeed" 2>/dev/null; then
    PYTHON=python3  # a cluster image with the project installed
  elif [ -n "${RANK:-}" ]; then
    echo "pretrain.sh: no environment on this rank; run 'bash scripts/setup.sh' once before launching" >&2
    exit 2
  fi
fi

if [ -n "${RANK:-}" ] && [ -n "${LOCAL_RANK:-}" ]; then  # already started by a launcher: be this rank
  # A SIGTERM that came already is the rank's to honour; one between here and the rank's own handler is
  # ignored rather than fatal (a rank killed by it fails the whole job; the others still stop as asked).
  [ -n "$stop_asked" ] && export IMPLICIT_MEGATRON_STOP_ASKED="$stop_asked"
  trap '' TERM HUP
  exec "$PYTHON" -m implicit_megatron.train "$config" "$@"
fi

if [ -z "${PYTHON:-}" ] || [ "$PYTHON" = "$root/.venv/bin/python" ]; then
  bash scripts/setup.sh  # idempotent: a no-op once .venv is up to date
  PYTHON="$root/.venv/bin/python"
fi
# Over several nodes DeepSpeed's launcher hands some environment values, .deepspeed_env lines and this
# directory to every node's shell: refused here if a shell would run anything in them.
multi_node=0
if [ -n "${HOSTFILE:-}" ] || [ "${NUM_NODES:-1}" != 1 ]; then
  multi_node=1
  "$PYTHON" -m implicit_megatron.launch.node_shell check
fi

# GPUs: torch is asked only where a GPU device node exists (NVIDIA, AMD, WSL); importing it to learn
# that a CPU machine has none cost 2 s a launch. GPU_DEVICE_NODES replaces the paths looked at.
gpus=0
# shellcheck disable=SC2086  # the default paths are globs
for node in ${GPU_DEVICE_NODES:-/dev/nvidia[0-9]* /dev/kfd /dev/dxg}; do
  if [ -e "$node" ]; then
    gpus="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
    break
  fi
done
if [ "$gpus" -gt 0 ]; then
  per_node="${GPUS_PER_NODE:-$gpus}"
else
  per_node="${NPROC:-1}"
fi
if [ -n "${HOSTFILE:-}" ]; then  # read by our own code (a mistake is one line naming its line), then DeepSpeed's
  hosts="$("$PYTHON" -m implicit_megatron.launch.hostfile "$HOSTFILE")"
fi
if [ -n "${HOSTFILE:-}" ] && [ -z "${NUM_NODES:-}" ]; then
  # every host of the hostfile, each with its slots; on CPUs a host runs one process per slot, and the
  # thread count below divides the cores by the most on any host
  read -r world most _ <<< "$hosts"
  if [ "$gpus" -eq 0 ]; then per_node="$most"; fi
  nodes=""
else
  nodes="${NUM_NODES:-1}"
  world=$((nodes * per_node))
fi

# Refuse a bad config here, before any process starts.
# Its output folder and tracking store: this launch's, never what a config saved in the folder says.
resolved="$("$PYTHON" -m implicit_megatron.config "$config" "$@" --world-size "$world" --get output_dir \
  --get tracking.uri)"
{ IFS= read -r outdir; IFS= read -r tracking_uri; } <<< "$resolved"
# One run per output folder: refuse here, before this launch writes into it (rank 0 takes the lock).
"$PYTHON" -m implicit_megatron.train.process.run_lock "$outdir"

cores="$(nproc 2>/dev/null || echo 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores / per_node > 0 ? cores / per_node : 1 ))}"
if [ -z "${MASTER_PORT:-}" ] && [ "${nodes:-0}" = 1 ]; then
  port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
else
  port="${MASTER_PORT:-29500}"
fi

# The launcher runs as a child of this script, in a session of its own, so that a Ctrl-C in the
# terminal reaches this script only. SIGTERM or a first Ctrl-C here writes the stop file the ranks
# watch (they finish the step, save and exit 0); a second Ctrl-C kills the launcher and its ranks at
# once. When the launcher itself was signalled too and exits non-zero, the ranks' preempted.json
# says the stop was graceful. The ranks end when this script or their launcher is gone.
ask_stop() {  # on a full disk the reason cannot be written: the file armed at launch is renamed instead
  { echo "$1" > "$outdir/stop-requested.tmp"; } 2>/dev/null || mv -f "$outdir/stop-requested.armed" "$outdir/stop-requested.tmp"
  mv -f "$outdir/stop-requested.tmp" "$outdir/stop-requested"
}
# The traps only count signals; the loop in launch() acts on them, outside any trap (an external
# command run from a trap that cut a `wait` short left bash deaf to the next Ctrl-C).
act_on_signals() {
  if [ "$terms" -gt "$terms_acted" ]; then
    terms_acted=$terms
    ask_stop SIGTERM
  fi
  if [ "$hangups" -gt "$hangups_acted" ]; then
    hangups_acted=$hangups
    ask_stop "SIGHUP (the terminal closed)"
  fi
  if [ "$interrupts" -eq 1 ] && [ "$interrupts_acted" = 0 ]; then
    interrupts_acted=1
    ask_stop "SIGINT (Ctrl-C)"
    echo "pretrain.sh: Ctrl-C: the ranks finish their step, save a checkpoint and stop (Ctrl-C again: at once)" >&2
  elif [ "$interrupts" -gt 1 ]; then
    kill -KILL -- "-$child" 2>/dev/null || true
    echo "pretrain.sh: stopped at once by a second Ctrl-C: what was trained since the last checkpoint is lost" >&2
    trap '' INT  # the ranks could not record their end in MLflow: it is recorded here, once
    "$PYTHON" -m implicit_megatron.tracking.end_run "$outdir" KILLED "$tracking_uri" || true
    exit 130
  fi
}
launch() {
  mkdir -p "$outdir"
  rm -f "$outdir/preempted.json" "$outdir/stop-requested"
  echo "SIGTERM" > "$outdir/stop-requested.armed"  # written while there is room: a stop needs no new space
  terms=0 terms_acted=0 hangups=0 hangups_acted=0 interrupts=0 interrupts_acted=0
  trap 'terms=$((terms + 1))' TERM  # from here a stop waits for the ranks' first step
  trap 'hangups=$((hangups + 1))' HUP
  if [ -n "$stop_asked" ]; then
    echo "{\"step\": null, \"checkpoint\": null, \"reason\": \"$stop_asked before the launch\"}" > "$outdir/preempted.json"
    echo "pretrain.sh: stopped by $stop_asked before the ranks started: nothing was trained; launch again to resume" >&2
    exit 0
  fi
  trap 'interrupts=$((interrupts + 1))' INT
  export IMPLICIT_MEGATRON_LAUNCHER_STOP_FILE=1  # the ranks keep a stop file they find (stopping.py)
  IMPLICIT_MEGATRON_LAUNCH_PID=$$ IMPLICIT_MEGATRON_LAUNCH_HOST="$(uname -n)"
  export IMPLICIT_MEGATRON_LAUNCH_PID IMPLICIT_MEGATRON_LAUNCH_HOST
  env_file=""
  if [ "$multi_node" = 1 ]; then
    # Several nodes: DeepSpeed's pdsh launch hands each node's shell only MLFLOW*, PYTHON*, NCCL*...
    # values and the lines of one environment file; what this launch sets for its ranks goes into a file
    # of its own after the user's lines, every value checked (launch/node_shell.py)
    env_file="$("$PYTHON" -m implicit_megatron.launch.node_shell write)"
    export DS_ENV_FILE="$env_file"
  fi
  setsid "$@" &
  child=$!
  while kill -0 "$child" 2>/dev/null; do  # a signal cuts the short sleep's wait: acted on at once
    act_on_signals
    sleep 0.5 &
    wait $! || true
  done
  set +e; wait "$child"; rc=$?; set -e
  if [ -n "$env_file" ]; then rm -f "$env_file"; fi
  if [ "$rc" -ne 0 ] && [ -f "$outdir/preempted.json" ]; then
    echo "pretrain.sh: stopped early with a checkpoint ($(cat "$outdir/preempted.json")); launch again to resume" >&2
    rc=0
  fi
  exit "$rc"
}

if [ "$multi_node" = 1 ]; then
  # pdsh's ssh: a node that vanishes (no route, powered off) ends its connection within 10 s of
  # silence instead of never, so the launch ends with the ranks that noticed it.
  export PDSH_SSH_ARGS_APPEND="${PDSH_SSH_ARGS_APPEND:-} -o ServerAliveInterval=5 -o ServerAliveCountMax=2"
  if [ "$gpus" -eq 0 ]; then
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"  # CPU ranks on gloo, on every node
  fi
fi
if [ "$gpus" -gt 0 ] || [ "$multi_node" = 1 ]; then
  # GPUs, or several nodes: DeepSpeed's launcher (over several nodes: pdsh, or LAUNCHER_ARGS' launcher).
  # --no_local_rank: the rank reads LOCAL_RANK from the environment, its arguments stay CONFIG [overrides]
  launcher=(deepspeed --no_local_rank --master_port "$port")
  [ -n "$nodes" ] && launcher+=(--num_nodes "$nodes")
  if [ "$gpus" -gt 0 ]; then
    [ -n "${GPUS_PER_NODE:-}" ] && launcher+=(--num_gpus "$GPUS_PER_NODE")  # else: the visible devices
  elif [ -z "${HOSTFILE:-}" ]; then
    launcher+=(--num_gpus "$per_node")  # CPU processes per node (with a hostfile: its slots)
  fi
  [ -n "${HOSTFILE:-}" ] && launcher+=(--hostfile "$HOSTFILE")
  [ -n "${MASTER_ADDR:-}" ] && launcher+=(--master_addr "$MASTER_ADDR")
  # shellcheck disable=SC2206
  launcher+=(${LAUNCHER_ARGS:-})
  deepspeed_bin="$(dirname "$PYTHON")/deepspeed"
  [ -x "$deepspeed_bin" ] && launcher[0]="$deepspeed_bin"
  if [ "$multi_node" = 1 ]; then
    # Several nodes: the launcher starts each node's ranks through a remote shell (pdsh, mpirun, srun),
    # which would split the arguments again and run what they hold ($(...), ;). They travel as one
    # base64 word instead (letters, digits, + / =), which the rank decodes (implicit_megatron.train).
    launch "${launcher[@]}" --module implicit_megatron.train --args-base64 \
      "$(printf '%s\0' "$config" "$@" | base64 | tr -d '\n')"
  fi
  launch "${launcher[@]}" --module implicit_megatron.train "$config" "$@"
fi

# shellcheck disable=SC2086
launch "$PYTHON" -m implicit_megatron.train.process.torchrun --nnodes 1 --nproc_per_node "$per_node" \
  --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "$port" ${LAUNCHER_ARGS:-} \
  -m implicit_megatron.train "$config" "$@"
