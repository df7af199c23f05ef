# syntax=docker/dockerfile:1
# EdgeFold's agent for data-center GPU servers (linux/amd64) on NVIDIA's TensorRT container:
#   make docker-dc
#   make docker-dc TORCH_TENSORRT=1      (+ Torch-TensorRT and ModelOpt, with the TensorRT that release requires)
#   docker run -d --gpus all -p 8765:8765 -v /etc/edgefold/token:/run/secrets/edgefold-token:ro \
#     -v edgefold-data:/var/lib/edgefold-agent IMAGE
# TensorRT 10.8, CUDA 12.8, Ubuntu 24.04, Python 3.12.
ARG BASE=nvcr.io/nvidia/tensorrt:25.01-py3

FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY setup.cfg pyproject.toml README.md ./
COPY device/ device/
COPY pipeline/ pipeline/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE}
# The Torch runner (data-center baselines, bench/dc_baseline.sh); WITH_TORCH=0 leaves it out (−2.5 GB).
ARG WITH_TORCH=1
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# The torch_tensorrt runtime (needs WITH_TORCH=1): Torch-TensorRT 2.14 pairs with torch 2.14 (pyproject.toml:
# torch>=2.14.0.dev,<2.15.0) and requires TensorRT 11.1 (setup.py get_x86_64_requirements: tensorrt>=11.1.0,<11.2.0
# and, for PyPI's CUDA 13 torch, tensorrt-cu13{,-bindings,-libs} of that range, from https://pypi.nvidia.com, the
# index its pyproject.toml names) — pytorch/TensorRT @main d7f2062, version.txt 2.14.0a0 (docker/platforms.py
# DC_TORCH_TENSORRT). Those wheels come first in the venv, so with this flag BOTH roads build with TensorRT 11.1,
# not the base image's 10.8: the side-by-side compares the roads, not two TensorRT releases.
ARG WITH_TORCH_TENSORRT=0
ARG TORCH_TENSORRT_VERSION=2.14.0
ARG TORCH_TENSORRT_TENSORRT=">=11.1.0,<11.2.0"
ARG MODELOPT_VERSION=0.47.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv && rm -rf /var/lib/apt/lists/*
# --system-site-packages: the container's TensorRT Python package is installed in the system Python.
RUN python3 -m venv --system-site-packages /opt/edgefold
COPY --from=wheel /wheels /wheels
# The project's lock (make lock): on x86_64 the versions the tests ran with (torch 2.14.1 as TORCH_VERSION); the
# Jetson image takes the agent's (docker/agent-constraints.txt: aarch64, numpy<2 for JetPack 6's wheels).
COPY constraints.txt /wheels/constraints.txt
RUN wheel="$(ls /wheels/edgefold-*.whl)" \
 && /opt/edgefold/bin/pip install --no-cache-dir -c /wheels/constraints.txt "${wheel}[device,nvml]" \
 && if [ "$WITH_TORCH" = 1 ]; then \
      /opt/edgefold/bin/pip install --no-cache-dir -c /wheels/constraints.txt "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"; \
    fi \
 && if [ "$WITH_TORCH_TENSORRT" = 1 ]; then \
      if [ "$WITH_TORCH" != 1 ]; then echo "error: WITH_TORCH_TENSORRT=1 needs WITH_TORCH=1" >&2; exit 2; fi; \
      /opt/edgefold/bin/pip install --no-cache-dir -c /wheels/constraints.txt --extra-index-url https://pypi.nvidia.com \
        "torch==${TORCH_VERSION}" "torch-tensorrt==${TORCH_TENSORRT_VERSION}" "nvidia-modelopt==${MODELOPT_VERSION}" \
        "tensorrt${TORCH_TENSORRT_TENSORRT}" "tensorrt-cu13${TORCH_TENSORRT_TENSORRT}" \
        "tensorrt-cu13-bindings${TORCH_TENSORRT_TENSORRT}" "tensorrt-cu13-libs${TORCH_TENSORRT_TENSORRT}"; \
    fi \
 && rm -rf /wheels
COPY docker/smoke_check.py /opt/edgefold/smoke_check.py
COPY bench/ /opt/edgefold/bench/
ENV PATH=/opt/edgefold/bin:$PATH
VOLUME ["/var/lib/edgefold-agent"]
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/edgefold/bin/python", "/opt/edgefold/smoke_check.py", "--health-only", "http://127.0.0.1:8765"]
ENTRYPOINT ["edgefold-agent"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8765", "--data-dir", "/var/lib/edgefold-agent", \
     "--token-file", "/run/secrets/edgefold-token"]
