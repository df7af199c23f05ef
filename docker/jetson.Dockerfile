# syntax=docker/dockerfile:1
# EdgeFold's agent for Jetson (linux/arm64), cross-built on an x86 workstation:
#   make docker-jetson L4T=36.4.3        (base image and Python from device/l4t.json)
#   make docker-jetson L4T=36.4.3 TORCH_TENSORRT=1   (+ Torch-TensorRT and ModelOpt: only for an L4T release
#                                         whose wheels docker/platforms.py knows; any other is refused by name)
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
# The torch_tensorrt runtime: set by `docker/platforms.py build-args L4T --torch-tensorrt`, never by hand (the index
# and the pinned, comma-separated packages come from its JETSON_TORCH_TENSORRT table and the sources it cites).
# The jtop client in the image must be the host service's major.minor (jtop refuses any other): pass the host's
# version (pip3 show jetson-stats on the Jetson) as make docker-jetson JETSON_STATS=4.2.12.
ARG JETSON_STATS=7.2.2
ARG WITH_TORCH_TENSORRT=0
ARG TORCH_TENSORRT_INDEX=
ARG TORCH_TENSORRT_PACKAGES=
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
# The agent's lock (make agent-lock), less jetson-stats: JETSON_STATS names the board's own service's release.
COPY docker/agent-constraints.txt /wheels/agent-constraints.txt
# With Torch-TensorRT, one pip call resolves the agent and the wheels together (torch_tensorrt's JetPack wheel
# requires numpy<2 and JetPack's TensorRT 10.3, which the venv sees in the system site packages). The torch wheel
# needs cuSPARSELt: pytorch/TensorRT's JetPack guide (docsrc/getting_started/jetpack.rst@v2.9.0) installs this
# archive when /usr/local/cuda/lib64/libcusparseLt.so is missing.
ARG CUSPARSELT=https://developer.download.nvidia.com/compute/cusparselt/redist/libcusparse_lt/linux-sbsa/libcusparse_lt-linux-sbsa-0.5.2.1-archive.tar.xz
# set -e: every step of the flag's branch must succeed (the SHELL has pipefail, not errexit).
RUN set -e; \
    wheel="$(ls /wheels/edgefold-*.whl)"; \
    grep -v '^jetson-stats==' /wheels/agent-constraints.txt > /tmp/agent-constraints.txt; \
    if [ "$WITH_TORCH_TENSORRT" = 1 ]; then \
      if [ -z "$TORCH_TENSORRT_INDEX" ] || [ -z "$TORCH_TENSORRT_PACKAGES" ]; then \
        echo "error: WITH_TORCH_TENSORRT=1 without TORCH_TENSORRT_INDEX/PACKAGES; use: make docker-jetson L4T=... TORCH_TENSORRT=1" >&2; \
        exit 2; \
      fi; \
      echo "$TORCH_TENSORRT_PACKAGES" | tr , '\n' > /tmp/torch-tensorrt.txt; \
      /opt/edgefold/bin/pip install --no-cache-dir -c /tmp/agent-constraints.txt --extra-index-url "$TORCH_TENSORRT_INDEX" "${wheel}[device]" "jetson-stats==${JETSON_STATS}" \
        -r /tmp/torch-tensorrt.txt; \
      rm /tmp/torch-tensorrt.txt; \
      if [ ! -e /usr/local/cuda/lib64/libcusparseLt.so ]; then \
        /opt/edgefold/bin/python -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], '/tmp/cusparselt.tar.xz')" "$CUSPARSELT"; \
        mkdir /tmp/cusparselt; \
        tar -xJf /tmp/cusparselt.tar.xz -C /tmp/cusparselt --strip-components=1; \
        cp -a /tmp/cusparselt/include/* /usr/local/cuda/include/; \
        cp -a /tmp/cusparselt/lib/* /usr/local/cuda/lib64/; \
        rm -rf /tmp/cusparselt /tmp/cusparselt.tar.xz; \
      fi; \
    else \
      /opt/edgefold/bin/pip install --no-cache-dir -c /tmp/agent-constraints.txt "${wheel}[device]" "jetson-stats==${JETSON_STATS}"; \
    fi; \
    rm -rf /wheels /tmp/agent-constraints.txt
COPY docker/smoke_check.py /opt/edgefold/smoke_check.py
ENV PATH=/opt/edgefold/bin:$PATH
VOLUME ["/var/lib/edgefold-agent"]
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/edgefold/bin/python", "/opt/edgefold/smoke_check.py", "--health-only", "http://127.0.0.1:8765"]
ENTRYPOINT ["edgefold-agent"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8765", "--data-dir", "/var/lib/edgefold-agent", \
     "--token-file", "/run/secrets/edgefold-token"]
