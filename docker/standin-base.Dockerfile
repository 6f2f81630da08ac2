# A stand-in for the base images of Dockerfile (rocm/pytorch) and docker/cuda.Dockerfile (pytorch/pytorch)
# on a machine that cannot pull them or has no GPU: Debian bookworm's Python 3.11 in a venv that comes
# first on PATH (as the Python of those images does), pip, and torch's CPU build installed the way
# scripts/setup.sh installs it. tools/dev/container_smoke.sh builds it FROM a debootstrap'd Debian (its
# DEBIAN_IMAGE) and then the project's images FROM it with GPU_KERNELS=0; it is not meant for training.
#   TORCH: a requirement (torch==2.13.0) or the path of a wheel mounted into the build
#   TORCH_INDEX_URL: the index torch (and its dependencies) come from; empty: pip's own default index
# ca/ in the build context holds extra CA certificates (*.crt) the machine's network needs; may be empty.

ARG DEBIAN_IMAGE=localhost/debian-minbase:bookworm
FROM ${DEBIAN_IMAGE}

ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates > /dev/null \
 && python3 -m venv /opt/venv

# pip reads the system's certificates (PIP_CERT for the first, older pip; truststore afterwards).
ENV PATH=/opt/venv/bin:${PATH} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# TORCH is pinned (a version or a wheel file); hadolint cannot see through the ARG.
# hadolint ignore=DL3013
RUN PIP_CERT=/etc/ssl/certs/ca-certificates.crt python3 -m pip install --upgrade "pip==26.3" "setuptools==80.9.0" \
        "wheel==0.48.0" \
 && python3 -m pip install ${TORCH_INDEX_URL:+--index-url "${TORCH_INDEX_URL}"} "${TORCH}" \
 && python3 -c "import torch; print('stand-in base: torch', torch.__version__)"
