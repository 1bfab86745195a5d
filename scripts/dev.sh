#!/usr/bin/env bash
# Brings the whole platform up on this machine: installs what is missing (a recent nats-server),
# builds chronoshard and runs `chronoshard dev` with the arguments given (see --help).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ensure_cargo
ensure_nats_server
cd "$ROOT"
cargo build --release --quiet --bin chronoshard
exec "$ROOT/target/release/chronoshard" dev "$@"
