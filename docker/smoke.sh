#!/usr/bin/env bash
# Smoke-tests a freshly built agent image: it starts, health answers, the device description is sane.
#   docker/smoke.sh IMAGE [MACHINE] [--tensorrt]      e.g. docker/smoke.sh edgefold-agent:0.1.0-l4t36.4 aarch64
# An arm64 image runs under QEMU on an x86 build host (set up binfmt first: see docker/README.md);
# there it has no GPU, so --tensorrt is only checked on a real device. Set RUNTIME=nvidia on a Jetson.
set -euo pipefail
image=${1:?usage: docker/smoke.sh IMAGE [MACHINE] [--tensorrt]}
machine=${2:-}
extra=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
name=edgefold-smoke-$$
port=${PORT:-18765}
python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$work/token"
chmod 644 "$work/token"
cleanup() { docker rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
docker run -d --name "$name" ${RUNTIME:+--runtime "$RUNTIME"} -p "127.0.0.1:$port:8765" \
  -v "$work/token:/run/secrets/edgefold-token:ro" "$image" >/dev/null
if ! python3 "$here/smoke_check.py" "http://127.0.0.1:$port" --token-file "$work/token" \
     ${machine:+--machine "$machine"} $extra --timeout-s 180; then
  docker logs "$name" | tail -40 >&2
  exit 1
fi
