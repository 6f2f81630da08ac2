# ROCm image for AMD MI300X (gfx942): the base image's ROCm build of PyTorch, kept as it is, plus the
# fused kernels (causal-conv1d, mamba-ssm, flash-attn's CK backend) built from source for gfx942,
# DeepSpeed and this project.
#   docker build -t implicit-megatron:rocm .
#   docker run --rm -it --device=/dev/kfd --device=/dev/dri --group-add video --ipc=host --shm-size=64g \
#       --security-opt seccomp=unconfined implicit-megatron:rocm
# docs/cluster.md has the multi-node launch and the acceptance run. Every pin is an ARG (override with
# --build-arg); tools/dev/check_dockerfiles.py checks them against pyproject.toml in CI.
# GPU_KERNELS=0 builds on a base without ROCm (tools/dev/container_smoke.sh: a Debian base with CPU torch):
# no fused kernels, any torch build is held as it is, and the models take their PyTorch paths, as on CPU.

ARG BASE_IMAGE=rocm/pytorch:rocm6.4.1_ubuntu24.04_py3.12_pytorch_release_2.7.1
FROM ${BASE_IMAGE}

ARG GPU_ARCH=gfx942
ARG CAUSAL_CONV1D_VERSION=1.5.0.post8
ARG MAMBA_SSM_VERSION=2.2.4
ARG FLASH_ATTN_VERSION=2.7.4
ARG FLASH_ATTN_REPO=https://github.com/ROCm/flash-attention.git
ARG FLASH_ATTN_REF=v2.7.4-cktile
ARG DEEPSPEED_VERSION=0.19.8
# mamba-ssm 2.2.x imports names that transformers 5 removed: with 5.x its kernels would not import.
ARG TRANSFORMERS_VERSION=4.57.6
ARG MAX_JOBS=16
ARG APP_USER=trainer
ARG USER_UID=1000
ARG GPU_KERNELS=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The build steps need root, whichever user the base image ends with.
USER root

# Each HIP build reads its own variable (torch's extensions PYTORCH_ROCM_ARCH, mamba-ssm and causal-conv1d
# HIP_ARCHITECTURES, flash-attn GPU_ARCHS); unset, they target the build machine's GPU, which a build has not.
# The *_FORCE_BUILD variables make the kernels compile here rather than fetch a prebuilt wheel.
# PIP_BREAK_SYSTEM_PACKAGES only matters if the base's Python is Ubuntu's own (marked externally managed).
ENV PYTORCH_ROCM_ARCH=${GPU_ARCH} \
    HIP_ARCHITECTURES=${GPU_ARCH} \
    GPU_ARCHS=${GPU_ARCH} \
    MAX_JOBS=${MAX_JOBS} \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE \
    MAMBA_FORCE_BUILD=TRUE \
    FLASH_ATTENTION_FORCE_BUILD=TRUE \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1

# Hold the image's torch (and the transformers that mamba-ssm needs): a later install that asks for
# another version fails instead of replacing the ROCm build with a CUDA or CPU wheel.
RUN python3 -c "import torch; assert torch.version.hip or '${GPU_KERNELS}' == '0', torch.__version__; print('torch==' + torch.__version__.split('+')[0])" \
        > /opt/constraints.txt \
 && echo "transformers==${TRANSFORMERS_VERSION}" >> /opt/constraints.txt
ENV PIP_CONSTRAINT=/opt/constraints.txt

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

# Build requirements of the kernels (installed without build isolation) and their run-time dependencies.
RUN python3 -m pip install "ninja==1.13.2" "packaging>=24" "wheel==0.48.0" "psutil>=5.9" "einops==0.8.2" \
        "transformers==${TRANSFORMERS_VERSION}"

# --no-build-isolation: compile against the image's torch (an isolated build would fetch another one);
# --no-deps: their dependencies are installed above, so pip has no reason to touch torch or triton.
RUN if [ "${GPU_KERNELS}" = 0 ]; then echo "GPU_KERNELS=0: no fused kernels, the PyTorch paths"; exit 0; fi \
 && python3 -m pip install --no-build-isolation --no-deps "causal-conv1d==${CAUSAL_CONV1D_VERSION}" \
 && python3 -m pip install --no-build-isolation --no-deps "mamba-ssm==${MAMBA_SSM_VERSION}"

# flash-attn for ROCm: AMD's fork with the composable_kernel (CK) backend, pinned by tag.
# hadolint ignore=DL3013
RUN if [ "${GPU_KERNELS}" = 0 ]; then exit 0; fi \
 && python3 -m pip install --no-build-isolation --no-deps "flash-attn @ git+${FLASH_ATTN_REPO}@${FLASH_ATTN_REF}" \
 && python3 -c "from importlib.metadata import version; v = version('flash-attn'); assert v.startswith('${FLASH_ATTN_VERSION}'), v"

# Training uses torch's AdamW, without offload, so it loads no DeepSpeed op: none is prebuilt
# (DS_BUILD_OPS=0). `ds_report` lists them; one a config might need later compiles on first use.
RUN DS_BUILD_OPS=0 python3 -m pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"

# A non-root user (Ubuntu 24.04 images already have "ubuntu" with UID 1000), in the groups of the GPU devices.
# USER_UID=0 (`--build-arg USER_UID="$(id -u)"` run as root) would make it root: refused with a line saying so.
RUN if [ "${USER_UID}" = 0 ]; then echo "USER_UID=0 would run the image as root: as root on the host keep the default" \
        "UID and chown it the mounted runs/ and data/cache" >&2; exit 1; fi \
 && if id ubuntu > /dev/null 2>&1; then userdel --remove ubuntu 2> /dev/null || true; fi \
 && useradd --no-log-init --create-home --uid "${USER_UID}" --shell /bin/bash "${APP_USER}" \
 && usermod -aG video "${APP_USER}" \
 && if getent group render > /dev/null; then usermod -aG render "${APP_USER}"; fi

WORKDIR /workspace/implicit-megatron
COPY --chown=${APP_USER}:${APP_USER} . .
# The project with its eval extra; torch>=2.4 is met by the image's torch, which the constraints hold.
# transformers is named again so that the resolver keeps to what it requires (huggingface-hub<1.0): left
# out, the extra's datasets takes a huggingface-hub 1.x and transformers (and with it mamba-ssm) no longer
# imports. The import below is the check.
# hadolint ignore=DL3013
RUN python3 -m pip install ".[eval]" "transformers==${TRANSFORMERS_VERSION}" \
 && rm -rf build ./*.egg-info \
 && chown "${APP_USER}:${APP_USER}" . \
 && python3 -c "import torch, deepspeed, transformers, implicit_megatron; assert torch.version.hip or '${GPU_KERNELS}' == '0', torch.__version__"

USER ${APP_USER}
CMD ["bash", "launch/pretrain.sh"]
