#!/usr/bin/env bash
# Builds the cluster images (Dockerfile for ROCm, docker/cuda.Dockerfile for NVIDIA) on a stand-in base
# and runs them, on a machine without their GPU base images or a GPU:
#   bash tools/dev/container_smoke.sh            (as root; podman, buildah and debootstrap from apt)
#
# 1. a Debian bookworm root file system (debootstrap --variant=minbase, with python3 and venv), imported
#    as localhost/debian-minbase:bookworm;
# 2. the stand-in base (docker/standin-base.Dockerfile): that Python in a venv, pip and torch's CPU build
#    (the version scripts/setup.sh installs), as localhost/implicit-megatron-standin:torch-cpu;
# 3. each project image FROM the stand-in with GPU_KERNELS=0 (no fused kernels: the PyTorch paths), as
#    localhost/implicit-megatron:rocm-standin and :cuda-standin; then inside each, as the image's own
#    user, with runs/ and data/cache bind-mounted from a scratch folder (data/cache shared by both):
#    the package imports, its requirements agree (pip check), the quickstart trains through the image's
#    default command, a paper config resolves, the checkpoint exports and the export loads.
# One line per check (ok / FAIL) with the times; exit 1 if any failed. Without podman, buildah or
# debootstrap, or without root, it prints one line saying what is missing and exits 0.
# Builds use podman's chroot isolation and the checks run through `buildah run`, which work where
# `podman run` does not (no cgroups v2, no daemon). What only a ROCm/CUDA host checks: the real base
# images and the fused kernels (GPU_KERNELS=1, the default, then tools/node/validate_kernels.py in the image).
# The images take the working tree as it is, as `docker build .` does.
#
# Settings (environment):
#   TORCH_WHEEL      a torch CPU wheel (cp311) for the stand-in base; default: one for the version in a
#                    folder of $PIP_FIND_LINKS, else torch from TORCH_INDEX_URL
#   TORCH_INDEX_URL  the package index torch's CPU build comes from without a wheel (yours, or torch's
#                    public CPU index); unset: pip's own default index
#   CA_BUNDLE        CA certificates the builds' network needs (a proxy's), added to the stand-in base;
#                    default $PIP_CERT, $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE where set
#   DEBIAN_MIRROR    the Debian mirror debootstrap reads; unset: debootstrap's own default
#   SMOKE_STEPS      training steps of the quickstart in each image (default 40: about 70 s on 2 cores,
#                    tokenizing included; 200 is the quickstart's own length, about 5 min)
#   FLAVOURS         default "rocm cuda"
#   SMOKE_DIR        scratch folder (default: a new one under ${TMPDIR:-/tmp}); a passing run keeps its logs
# Images stay cached, so a second run rebuilds only what changed. To remove them:
#   podman rmi localhost/implicit-megatron:rocm-standin localhost/implicit-megatron:cuda-standin \
#       localhost/implicit-megatron-standin:torch-cpu localhost/debian-minbase:bookworm && podman image prune -f
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, without its comment marks
  sed -n '2,/^set -uo pipefail/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi

DEBIAN_IMAGE=localhost/debian-minbase:bookworm
BASE_IMAGE=localhost/implicit-megatron-standin:torch-cpu
passed=0
failed=0
containers=()

ok() { passed=$((passed + 1)); echo "ok    $*"; }
fail() {  # fail MESSAGE [LOG]: the line, then the end of the log
  failed=$((failed + 1))
  echo "FAIL  $1"
  if [ -n "${2:-}" ] && [ -s "$2" ]; then
    tail -n 15 "$2" | sed 's/^/      | /'
    echo "      (full log: $2)"
  fi
}
took() { echo "$((SECONDS - $1)) s"; }

# shellcheck disable=SC2317  # run by the EXIT trap
# shellcheck disable=SC2329  # the EXIT trap
cleanup() {
  local c
  for c in "${containers[@]+"${containers[@]}"}"; do buildah rm "$c" > /dev/null 2>&1; done
  rm -rf "$work/rootfs"
}

in_image() {  # in_image LOG CMD...: CMD in the current container ($ctr) as the image's user, output to LOG
  local log="$1"
  shift
  buildah run --isolation chroot "${mounts[@]+"${mounts[@]}"}" "$ctr" -- "$@" > "$log" 2>&1
}

debian_base() {  # Debian bookworm, minimal, with Python 3.11 and venv (which brings pip)
  local t=$SECONDS log="$work/logs/debootstrap.log"
  if podman image exists "$DEBIAN_IMAGE"; then
    ok "debian base $DEBIAN_IMAGE (cached)"
    return 0
  fi
  if debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" \
       ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} > "$log" 2>&1 \
     && tar -C "$work/rootfs" -c . | podman import - "$DEBIAN_IMAGE" >> "$log" 2>&1; then
    ok "debian base $DEBIAN_IMAGE: debootstrap bookworm minbase + python3 ($(took "$t"))"
    rm -rf "$work/rootfs"
  else
    fail "debian base: debootstrap bookworm" "$log"
    return 1
  fi
}

standin_base() {  # torch's CPU build on it, from a wheel on this machine or from the public CPU index
  local torch_version wheel="${TORCH_WHEEL:-}" dir candidate ctx="$work/standin-context" ca from args t log
  torch_version="$(sed -n 's/.*"torch==\([0-9][0-9.]*\)".*/\1/p' scripts/setup.sh | head -n 1)"
  torch_version="${torch_version:-2.13.0}"
  if [ -z "$wheel" ]; then
    for dir in ${PIP_FIND_LINKS:-}; do
      for candidate in "$dir"/torch-"$torch_version"+cpu-cp311-cp311-*linux*_x86_64.whl; do
        [ -f "$candidate" ] && wheel="$candidate"
      done
    done
  fi
  mkdir -p "$ctx/ca"
  ca="${CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-${REQUESTS_CA_BUNDLE:-}}}}"
  if [ -n "$ca" ] && [ -f "$ca" ]; then cp "$ca" "$ctx/ca/extra.crt"; fi
  args=(--build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE")
  if [ -n "$wheel" ]; then  # mounted for the build only; torch's dependencies come from pip's index
    args+=(--volume "$(cd "$(dirname "$wheel")" && pwd):/wheels:ro" --build-arg "TORCH=/wheels/$(basename "$wheel")")
    from="$wheel"
  else
    from="${TORCH_INDEX_URL:-the default index of pip}"
    args+=(--build-arg "TORCH=torch==$torch_version" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL:-}")
  fi
  t=$SECONDS
  log="$work/logs/build-standin.log"
  if podman build --isolation chroot --format docker -f docker/standin-base.Dockerfile "${args[@]}" \
       -t "$BASE_IMAGE" "$ctx" > "$log" 2>&1; then
    grep -q 'stand-in base: torch' "$log" || from="$from, cached"
    ok "stand-in base $BASE_IMAGE: torch==$torch_version (CPU) from $from ($(took "$t"))"
  else
    fail "stand-in base: podman build -f docker/standin-base.Dockerfile" "$log"
    return 1
  fi
}

smoke_image() {  # smoke_image FLAVOUR: build the project's image on the stand-in, then the checks inside it
  local flavour="$1" dockerfile image t log user workdir name uid home runs overrides shards_before owner
  local -a command
  case "$flavour" in
    rocm) dockerfile=Dockerfile ;;
    cuda) dockerfile=docker/cuda.Dockerfile ;;
    *) fail "$flavour: no such image (FLAVOURS takes rocm and cuda)"; return ;;
  esac
  image="localhost/implicit-megatron:$flavour-standin"
  t=$SECONDS
  log="$work/logs/build-$flavour.log"
  if podman build --isolation chroot --format docker -f "$dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
       --build-arg GPU_KERNELS=0 -t "$image" . > "$log" 2>&1; then
    ok "$flavour: build $dockerfile FROM the stand-in, GPU_KERNELS=0 -> $image ($(took "$t"))"
  else
    fail "$flavour: build $dockerfile FROM the stand-in, GPU_KERNELS=0" "$log"
    return
  fi

  user="$(podman image inspect --format '{{.Config.User}}' "$image")"
  workdir="$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")"
  mapfile -t command < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$image" \
                         | sed '/^$/d')
  log="$work/logs/from-$flavour.log"
  if ! ctr="$(buildah from --name "container-smoke-$flavour-$$" "$image" 2> "$log")"; then
    fail "$flavour: buildah from $image" "$log"
    return
  fi
  containers+=("$ctr")
  mounts=()

  log="$work/logs/$flavour-user.log"
  # shellcheck disable=SC2016  # expanded inside the container
  if in_image "$log" bash -c 'echo "$(id -un) $(id -u) $HOME"' && read -r name uid home < "$log" \
     && [ "$name" = "$user" ] && [ "$uid" != 0 ]; then
    ok "$flavour: runs as the image's USER $name (uid $uid, HOME $home), not root"
  else
    fail "$flavour: runs as the image's USER ${user:-(none)}, not root" "$log"
    return
  fi

  log="$work/logs/$flavour-import.log"
  if in_image "$log" python3 -c 'import deepspeed, implicit_megatron, torch, transformers
from implicit_megatron.models.kernels import installed
print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, transformers {transformers.__version__}, "
      f"fused kernels: {[k for k, v in installed().items() if v] or None}")'; then
    ok "$flavour: imports implicit_megatron ($(tail -n 1 "$log"))"
  else
    fail "$flavour: imports implicit_megatron" "$log"
  fi
  log="$work/logs/$flavour-pip-check.log"
  if in_image "$log" python3 -m pip check; then
    ok "$flavour: pip check ($(tail -n 1 "$log"))"
  else
    fail "$flavour: pip check (installed packages whose requirements are not met)" "$log"
  fi

  # runs/ from the host, writable by the image's user (what `--build-arg USER_UID="$(id -u)"` gives a user's
  # own runs/); data/cache shared by both images.
  runs="$work/$flavour/runs"
  rm -rf "$runs"  # a run from scratch, also where SMOKE_DIR holds an earlier one
  mkdir -p "$runs"
  chown "$uid" "$runs" "$cache"
  mounts=(--volume "$runs:$workdir/runs" --volume "$cache:$workdir/data/cache")
  overrides=("train.steps=$steps" "train.eval_interval=$((steps / 2))" "checkpoint.interval=$((steps / 2))"
             "schedule.warmup_steps=$((steps / 10 > 0 ? steps / 10 : 1))")
  t=$SECONDS
  log="$work/logs/$flavour-quickstart.log"
  shards_before="$(find "$cache" -name 'neox_train.bin' 2> /dev/null)"
  if in_image "$log" "${command[@]}" configs/quickstart.yaml "${overrides[@]}" \
     && [ -e "$runs/quickstart/checkpoints/latest" ]; then
    ok "$flavour: quickstart through the image's command (${command[*]} configs/quickstart.yaml ${overrides[*]}):" \
       "checkpoint $(cat "$runs/quickstart/checkpoints/latest") in the mounted runs/ ($(took "$t"))"
    grep -E '^\[train\] (step|done)' "$log" | sed -n '1p;$p' | sed 's/ | RSS .*//; s/^/      | /'
  else
    fail "$flavour: quickstart through the image's command (${command[*]} configs/quickstart.yaml)" "$log"
    return
  fi
  if grep -q '^\[data\] building' "$log"; then
    if [ -z "$shards_before" ]; then
      ok "$flavour: tokenized the corpus into the mounted data/cache"
    else
      fail "$flavour: tokenized the corpus again although the mounted data/cache has its shards" "$log"
    fi
  elif [ -n "$shards_before" ]; then
    ok "$flavour: reused the shards in the mounted data/cache (no tokenization)"
  else
    fail "$flavour: no shards in the mounted data/cache after the quickstart" "$log"
  fi

  log="$work/logs/$flavour-config.log"
  if in_image "$log" python3 -m implicit_megatron.config configs/mamba2/130m-implicit.yaml \
       'data.prefixes=[data/cache/shakespeare/neox]' data.source=data/corpus/shakespeare.jsonl.zst --world-size 8 \
     && grep -q '^name: mamba2-130m-implicit' "$log"; then
    ok "$flavour: python -m implicit_megatron.config configs/mamba2/130m-implicit.yaml (world size 8, bundled shards)"
  else
    fail "$flavour: python -m implicit_megatron.config configs/mamba2/130m-implicit.yaml" "$log"
  fi

  t=$SECONDS
  log="$work/logs/$flavour-export.log"
  if in_image "$log" python3 tools/convert_checkpoint.py export runs/quickstart/checkpoints runs/quickstart/export \
     && owner="$(stat -c %u "$runs/quickstart/export/model.safetensors")" && [ "$owner" = "$uid" ]; then
    ok "$flavour: tools/convert_checkpoint.py export -> runs/quickstart/export" \
       "($(find "$runs/quickstart/export" -maxdepth 1 -type f -printf '%f\n' | sort | tr '\n' ' ')owned by uid $owner" \
       "on the host)" \
       "($(took "$t"))"
  else
    fail "$flavour: tools/convert_checkpoint.py export (owner on the host: ${owner:-none})" "$log"
    return
  fi

  log="$work/logs/$flavour-load.log"
  if in_image "$log" python3 -c 'import torch
from implicit_megatron import from_pretrained
model = from_pretrained("runs/quickstart/export").eval()
with torch.no_grad():
    logits = model(torch.tensor([[510, 7291, 273]]))
assert torch.isfinite(logits).all()
print(f"logits {tuple(logits.shape)}")'; then
    ok "$flavour: the export loads with from_pretrained and predicts ($(tail -n 1 "$log"))"
  else
    fail "$flavour: the export loads with from_pretrained" "$log"
  fi
}

main() {
  local root tool free_gb flavour
  local -a missing=()
  root="$(cd "$(dirname "$0")/../.." && pwd)"
  cd "$root" || exit 1
  for tool in podman buildah debootstrap; do
    command -v "$tool" > /dev/null 2>&1 || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "container_smoke: skipped: ${missing[*]} not installed (apt-get install podman buildah debootstrap)"
    exit 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "container_smoke: skipped: needs root (debootstrap, and podman's chroot builds)"
    exit 0
  fi

  steps="${SMOKE_STEPS:-40}"
  work="${SMOKE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/container-smoke.XXXXXX")}"
  cache="$work/data-cache"  # data/cache of both containers: the second must not tokenize again
  mkdir -p "$work/logs" "$cache"
  trap cleanup EXIT
  trap 'exit 130' INT TERM

  free_gb="$(df -P --block-size=1G "$(podman info --format '{{.Store.GraphRoot}}' 2> /dev/null || echo /var/lib)" \
             | awk 'NR == 2 { print $4 }')"
  if [ "${free_gb:-0}" -lt 8 ]; then
    fail "disk: ${free_gb:-?} GB free for podman's storage; 8 GB needed (the images share about 4 GB)"
    exit 1
  fi

  debian_base || exit 1
  standin_base || exit 1
  for flavour in ${FLAVOURS:-rocm cuda}; do
    smoke_image "$flavour"
  done

  echo "summary: $passed ok, $failed FAIL in $((SECONDS / 60)) min $((SECONDS % 60)) s; images kept" \
       "(podman images 'localhost/implicit-megatron*'); logs in $work/logs"
  [ "$failed" -eq 0 ] || exit 1
  rm -rf "$work/standin-context" "$cache" "${work:?}/rocm" "${work:?}/cuda"  # a passing run keeps its logs
}

main "$@"; exit $?  # one line: bash has read all of it, so editing this file during a run does not disturb the run
