#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, and the whole test suite with real components
# (each test starts its own nats-server on a free port with a temp store; the Postgres tests start
# their own PostgreSQL server in a temp dir).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ensure_cargo
ensure_nats_server
echo "using nats-server: $CHRONOSHARD_NATS_SERVER ($("$CHRONOSHARD_NATS_SERVER" --version))"
ensure_postgres
echo "using PostgreSQL binaries: $CHRONOSHARD_PG_BIN ($("$CHRONOSHARD_PG_BIN/postgres" --version))"
ensure_python_nats
echo "using python3: $(command -v python3) ($(python3 --version 2>&1)), $(python_nats_version)"
ensure_openapi_client
echo "using $OPENAPI_PYTHON_CLIENT from $CHRONOSHARD_OPENAPI_PYTHONPATH"
ensure_schemathesis
echo "using $SCHEMATHESIS from $CHRONOSHARD_FUZZ_PYTHONPATH"
cd "$ROOT"
# A clean CI clone builds everything once: incremental compilation's caches only cost time there.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
if [ "$(uname -m)" = x86_64 ] && [ "$(uname -s)" = Linux ]; then use_mold; fi
phase() { echo "--- $1 at ${SECONDS}s"; }
phase "formatting"
cargo fmt --all -- --check
phase "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
phase "alert rules"
ensure_prometheus_tools
echo "using prometheus: $CHRONOSHARD_PROMETHEUS, alertmanager: $CHRONOSHARD_ALERTMANAGER"
bash alerts/check.sh
# Tests run side by side (scripts/run-tests.sh): most of their time is spent waiting on
# the processes and timers they start, so a serial run would take twice as long.
phase "tests"
bash scripts/run-tests.sh
phase "done"
