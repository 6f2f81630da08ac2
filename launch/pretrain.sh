#!/usr/bin/env bash
# Launch pretraining:  bash launch/pretrain.sh [CONFIG] [key=value ...]
#
# With no CONFIG it runs configs/quickstart.yaml (the bundled corpus is tokenized on first use).
#   GPUs:   the DeepSpeed launcher, GPUS_PER_NODE processes per node (default: all visible GPUs),
#           NUM_NODES nodes (default 1; with HOSTFILE, the hosts listed there), MASTER_ADDR/PORT.
#   No GPU: NPROC CPU processes on gloo (default 1) through torchrun.
#   Already started by a launcher (RANK and LOCAL_RANK set, e.g. `deepspeed --no_python
#   launch/pretrain.sh CONFIG` or one `srun` task per GPU): runs this rank directly.
# Other settings: LAUNCHER_ARGS (extra launcher flags), OMP_NUM_THREADS (default: cores / processes),
#   PYTHON (the interpreter; default: .venv, set up on first use, or an installed package's python).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

config="${1:-configs/quickstart.yaml}"
[ $# -gt 0 ] && shift
export MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

if [ -z "${PYTHON:-}" ]; then
  if [ ! -x .venv/bin/python ] && python3 -c "import implicit_megatron, torch, deepspeed" 2>/dev/null; then
    PYTHON=python3  # a cluster image with the project installed
  else
    bash scripts/setup.sh
    PYTHON="$root/.venv/bin/python"
  fi
fi

if [ -n "${RANK:-}" ] && [ -n "${LOCAL_RANK:-}" ]; then
  exec "$PYTHON" -m implicit_megatron.train "$config" "$@"
fi

gpus="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
nodes="${NUM_NODES:-1}"
if [ "$gpus" -gt 0 ]; then
  per_node="${GPUS_PER_NODE:-$gpus}"
else
  per_node="${NPROC:-1}"
fi
world=$((nodes * per_node))

# Refuse a bad config here, before any process starts.
"$PYTHON" -m implicit_megatron.config "$config" "$@" --world-size "$world" > /dev/null

cores="$(nproc 2>/dev/null || echo 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores / per_node > 0 ? cores / per_node : 1 ))}"
port="${MASTER_PORT:-29500}"

if [ "$gpus" -gt 0 ]; then
  launcher=(deepspeed --num_nodes "$nodes" --num_gpus "$per_node" --master_port "$port")
  [ -n "${HOSTFILE:-}" ] && launcher+=(--hostfile "$HOSTFILE")
  [ -n "${MASTER_ADDR:-}" ] && launcher+=(--master_addr "$MASTER_ADDR")
  # shellcheck disable=SC2206
  launcher+=(${LAUNCHER_ARGS:-})
  deepspeed_bin="$(dirname "$PYTHON")/deepspeed"
  [ -x "$deepspeed_bin" ] && launcher[0]="$deepspeed_bin"
  exec "${launcher[@]}" --module implicit_megatron.train "$config" "$@"
fi

if [ "$nodes" -gt 1 ]; then
  echo "pretrain.sh: NUM_NODES=$nodes without GPUs is not supported; run one launch per node with a launcher" >&2
  exit 2
fi
# shellcheck disable=SC2086
exec "$PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node "$per_node" \
  --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "$port" ${LAUNCHER_ARGS:-} \
  -m implicit_megatron.train "$config" "$@"
