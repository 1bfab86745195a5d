#!/usr/bin/env bash
# Runs the whole test suite: every test of the workspace with cargo-nextest (each test in a process
# of its own, several side by side: .config/nextest.toml), then the doc tests, which nextest does
# not run. Exits non-zero when any test failed; nextest lists the failed ones last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. scripts/lib.sh
ensure_nextest
start=$SECONDS
cargo nextest run --workspace --locked --no-fail-fast
echo "--- nextest took $((SECONDS - start)) s; the doc tests follow"
cargo test --workspace --locked --doc
