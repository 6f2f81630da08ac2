# NVIDIA image for A100 / H100 (compute capabilities 8.0 and 9.0): the base image's CUDA build of
# PyTorch, kept as it is, plus the fused kernels (causal-conv1d, mamba-ssm, flash-attn) built from
# source for 8.0 and 9.0, DeepSpeed and this project.
#   docker build -f docker/cuda.Dockerfile -t implicit-megatron:cuda .
#   docker run --rm -it --gpus all --ipc=host --shm-size=64g implicit-megatron:cuda
# docs/cluster.md has the multi-node launch and the acceptance run. Every pin is an ARG (override with
# --build-arg); tools/dev/check_dockerfiles.py checks them against pyproject.toml in CI.
# GPU_KERNELS=0 builds on a base without CUDA (tools/dev/container_smoke.sh: a Debian base with CPU torch):
# no fused kernels, any torch build is held as it is, and the models take their PyTorch paths, as on CPU.

ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.6-cudnn9-devel
FROM ${BASE_IMAGE}

ARG CUDA_ARCH_LIST="8.0;9.0"
ARG FLASH_ATTN_CUDA_ARCHS="80;90"
ARG CAUSAL_CONV1D_VERSION=1.5.0.post8
ARG MAMBA_SSM_VERSION=2.2.4
ARG FLASH_ATTN_VERSION=2.7.4.post1
ARG DEEPSPEED_VERSION=0.19.8
# mamba-ssm 2.2.x imports names that transformers 5 removed: with 5.x its kernels would not import.
ARG TRANSFORMERS_VERSION=4.57.6
ARG MAX_JOBS=16
ARG APP_USER=trainer
ARG USER_UID=1000
ARG GPU_KERNELS=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Without a GPU at build time the architectures must be named: torch's extension builder (and DeepSpeed's)
# reads TORCH_CUDA_ARCH_LIST, flash-attn FLASH_ATTN_CUDA_ARCHS (its default adds Blackwell, doubling the
# build); mamba-ssm and causal-conv1d add their own list, which has 8.0 and 9.0. The *_FORCE_BUILD variables
# make the kernels compile here rather than fetch a prebuilt wheel made for another torch.
ENV TORCH_CUDA_ARCH_LIST=${CUDA_ARCH_LIST} \
    FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS} \
    MAX_JOBS=${MAX_JOBS} \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE \
    MAMBA_FORCE_BUILD=TRUE \
    FLASH_ATTENTION_FORCE_BUILD=TRUE \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Hold the image's torch (and the transformers that mamba-ssm needs): a later install that asks for
# another version fails instead of replacing the image's CUDA build.
RUN python3 -c "import torch; assert torch.version.cuda or '${GPU_KERNELS}' == '0', torch.__version__; print('torch==' + torch.__version__.split('+')[0])" \
        > /opt/constraints.txt \
 && echo "transformers==${TRANSFORMERS_VERSION}" >> /opt/constraints.txt
ENV PIP_CONSTRAINT=/opt/constraints.txt

# Build requirements of the kernels (installed without build isolation) and their run-time dependencies.
RUN python3 -m pip install "ninja==1.13.2" "packaging>=24" "wheel==0.48.0" "psutil>=5.9" "einops==0.8.2" \
        "transformers==${TRANSFORMERS_VERSION}"

# --no-build-isolation: compile against the image's torch (an isolated build would fetch another one);
# --no-deps: their dependencies are installed above, so pip has no reason to touch torch or triton.
RUN if [ "${GPU_KERNELS}" = 0 ]; then echo "GPU_KERNELS=0: no fused kernels, the PyTorch paths"; exit 0; fi \
 && python3 -m pip install --no-build-isolation --no-deps "causal-conv1d==${CAUSAL_CONV1D_VERSION}" \
 && python3 -m pip install --no-build-isolation --no-deps "mamba-ssm==${MAMBA_SSM_VERSION}"

# The longest step by far; lower MAX_JOBS if the build machine runs out of memory.
RUN if [ "${GPU_KERNELS}" = 0 ]; then exit 0; fi \
 && python3 -m pip install --no-build-isolation --no-deps "flash-attn==${FLASH_ATTN_VERSION}"

# Training uses torch's AdamW, without offload, so it loads no DeepSpeed op: none is prebuilt
# (DS_BUILD_OPS=0). `ds_report` lists them; one a config might need later compiles on first use.
RUN DS_BUILD_OPS=0 python3 -m pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"

# A non-root user. USER_UID=0 (`--build-arg USER_UID="$(id -u)"` run as root) would make it root: refused.
RUN if [ "${USER_UID}" = 0 ]; then echo "USER_UID=0 would run the image as root: as root on the host keep the default" \
        "UID and chown it the mounted runs/ and data/cache" >&2; exit 1; fi \
 && useradd --no-log-init --create-home --uid "${USER_UID}" --shell /bin/bash "${APP_USER}"

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
 && python3 -c "import torch, deepspeed, transformers, implicit_megatron; assert torch.version.cuda or '${GPU_KERNELS}' == '0', torch.__version__"

USER ${APP_USER}
CMD ["bash", "launch/pretrain.sh"]
