#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, and the whole test suite with real components
# (each test starts its own nats-server on a free port with a temp store).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ensure_cargo
ensure_nats_server
echo "using nats-server: $CHRONOSHARD_NATS_SERVER ($("$CHRONOSHARD_NATS_SERVER" --version))"
cd "$ROOT"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
