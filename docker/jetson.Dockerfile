# syntax=docker/dockerfile:1
# EdgeFold's agent for Jetson (linux/arm64), cross-built on an x86 workstation:
#   make docker-jetson L4T=36.4.3        (base image and Python from device/l4t.json)
# Run it on the Jetson (the jtop service runs on the host; the token is mounted, never baked in):
#   docker run -d --runtime nvidia --network host -v /run/jtop.sock:/run/jtop.sock \
#     -v /etc/edgefold/token:/run/secrets/edgefold-token:ro -v edgefold-data:/var/lib/edgefold-agent IMAGE
ARG BASE=nvcr.io/nvidia/l4t-jetpack:r36.4.0

# The wheel is pure Python: build it on the build host's own platform, not under QEMU.
FROM --platform=$BUILDPLATFORM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY setup.cfg pyproject.toml README.md ./
COPY device/ device/
COPY pipeline/ pipeline/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE}
ARG PYTHON_VERSION=3.10
ARG PYTHON_SOURCE=system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
# JetPack 5 ships Python 3.8; the agent needs 3.10, which deadsnakes provides on Ubuntu 20.04.
# Ubuntu's package versions move with the L4T base image, so they are not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
 && if [ "$PYTHON_SOURCE" = deadsnakes ]; then \
      apt-get install -y --no-install-recommends software-properties-common gpg-agent \
      && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update; \
    fi \
 && apt-get install -y --no-install-recommends "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" \
 && rm -rf /var/lib/apt/lists/*
# --system-site-packages: JetPack's TensorRT bindings (python3-libnvinfer) live in the system Python.
RUN "python${PYTHON_VERSION}" -m venv --system-site-packages /opt/edgefold
COPY --from=wheel /wheels /wheels
RUN wheel="$(ls /wheels/edgefold-*.whl)" \
 && /opt/edgefold/bin/pip install --no-cache-dir "${wheel}[device,jetson]" \
 && rm -rf /wheels
COPY docker/smoke_check.py /opt/edgefold/smoke_check.py
ENV PATH=/opt/edgefold/bin:$PATH
VOLUME ["/var/lib/edgefold-agent"]
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/edgefold/bin/python", "/opt/edgefold/smoke_check.py", "--health-only", "http://127.0.0.1:8765"]
ENTRYPOINT ["edgefold-agent"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8765", "--data-dir", "/var/lib/edgefold-agent", \
     "--token-file", "/run/secrets/edgefold-token"]
