# syntax=docker/dockerfile:1
# EdgeFold's build side (linux/amd64): the pipeline with torch, ModelOpt and Fashion-MNIST.
#   make docker-pipeline
#   docker run --rm -v "$PWD/runs:/work/runs" IMAGE run resnet50 --edge http://jetson:8765 \
#     --token-file /run/secrets/edgefold-token      (mount the token; add --gpus all on a GPU host)
FROM python:3.11-slim-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY setup.cfg pyproject.toml README.md constraints.txt ./
COPY device/ device/
COPY pipeline/ pipeline/
# The lock the tests ran with (make lock), as make installs it.
RUN python -m venv /opt/edgefold \
 && /opt/edgefold/bin/pip install --no-cache-dir ".[build,device,modelopt,nvml]" -c constraints.txt

FROM python:3.11-slim-bookworm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PATH=/opt/edgefold/bin:$PATH
# The embedded default data set (Debian's Fashion-MNIST) and OpenCV's runtime libraries.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist libgl1 libglib2.0-0 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/edgefold /opt/edgefold
WORKDIR /work
COPY models/ models/
ENTRYPOINT ["edgefold"]
CMD ["--help"]
