#!/bin/bash
# `make test` on a clean clone of this repository with one core kept busy by another process, as a loaded CI host
# would be: the suite's truths must not come from the wall clock. Appends one line per run (date, commit, machine,
# wall seconds, pytest's summary) to bench/results/loaded-make-test.md.
#
#   bash bench/loaded_make_test.sh            # clones HEAD into /tmp/edgefold-loaded (a venv there is reused)
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/edgefold-loaded}
commit=$(git -C "$repo" rev-parse --short HEAD)
venv_kept=""
if [ -d "$work/.venv" ]; then mv "$work/.venv" /tmp/edgefold-loaded-venv.$$ && venv_kept=1; fi
rm -rf "$work" && git clone -q "$repo" "$work"
if [ -n "$venv_kept" ]; then mv /tmp/edgefold-loaded-venv.$$ "$work/.venv"; fi
# The load: one core spinning for at most 40 minutes, stopped when the suite ends however it ends.
timeout 2400 python3 -c "while True: pass" &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
start=$(date +%s)
(cd "$work" && make test) > "$work/loaded.log" 2>&1
rc=$?
end=$(date +%s)
kill $busy 2>/dev/null
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
summary=$(grep -E '^=+ .*(passed|failed|error)' "$work/loaded.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
line="| $(date -u +%Y-%m-%dT%H:%MZ) | $commit | $cpu, $(nproc) cores, one kept busy | $((end - start)) | rc $rc: $summary |"
results="$repo/bench/results/loaded-make-test.md"
if [ ! -f "$results" ]; then
  printf '# make test on a loaded host\n\nbench/loaded_make_test.sh: a clean clone, one core kept busy by a spinning process.\n\n| date | commit | machine | wall s (venv included when new) | result |\n|---|---|---|---|---|\n' > "$results"
fi
echo "$line" >> "$results"
echo "$line"
exit $rc
