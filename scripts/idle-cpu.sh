#!/usr/bin/env bash
# What an idle `chronoshard dev` costs: starts one with the binary given (default: the release
# build), lets it settle, and prints the CPU its process and its nats-server used over the
# window, in percent of one core. Compare two builds by alternating runs:
#   scripts/idle-cpu.sh /tmp/chronoshard-before 60; scripts/idle-cpu.sh target/release/chronoshard 60
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ensure_nats_server
bin=${1:-$ROOT/target/release/chronoshard}
secs=${2:-60}
data=$(mktemp -d "${TMPDIR:-/tmp}/chronoshard-idle-XXXXXX")
log="$data/dev.log"
"$bin" dev --data "$data/dev" --http 127.0.0.1:0 --token idle >"$log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 240); do
  grep -q "nats:" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.5
done
# Past the start: shards opened, leases taken, first heartbeats sent.
sleep 15
nats=$(pgrep -f -- "--store_dir $data/dev/nats" | head -1)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
d0=$(cpu $pid); n0=$(cpu "$nats")
sleep "$secs"
d1=$(cpu $pid); n1=$(cpu "$nats")
awk -v d=$((d1 - d0)) -v n=$((n1 - n0)) -v hz="$(getconf CLK_TCK)" -v s="$secs" \
  'BEGIN { printf "dev %.2f%%  nats-server %.2f%%  (of one core, over %d s)\n", 100*d/hz/s, 100*n/hz/s, s }'
