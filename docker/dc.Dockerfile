# syntax=docker/dockerfile:1
# EdgeFold's agent for data-center GPU servers (linux/amd64) on NVIDIA's TensorRT container:
#   make docker-dc
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
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv && rm -rf /var/lib/apt/lists/*
# --system-site-packages: the container's TensorRT Python package is installed in the system Python.
RUN python3 -m venv --system-site-packages /opt/edgefold
COPY --from=wheel /wheels /wheels
RUN wheel="$(ls /wheels/edgefold-*.whl)" \
 && /opt/edgefold/bin/pip install --no-cache-dir "${wheel}[device,nvml]" \
 && if [ "$WITH_TORCH" = 1 ]; then \
      /opt/edgefold/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"; \
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
