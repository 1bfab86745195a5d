#!/usr/bin/env bash
# Builds every test binary of the workspace once, then runs the binaries side by side
# (TEST_JOBS at a time, 3 by default) with the doc tests beside them. Most tests spend their time
# waiting for occurrences to fall due and for the processes they started, not on the CPU, so
# running binaries in parallel shortens the run far more than it slows any one test.
#
# Each binary's output is kept in its own log and printed whole when the binary ends, so the lines
# of binaries running side by side never interleave. The exit status is non-zero when any binary
# failed; their names are listed last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
jobs="${TEST_JOBS:-3}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
export logs

# cargo prints one JSON line per built artifact; a test binary is one with an executable built
# with the test flag. Each line here is "<crate folder> <binary>": cargo runs a test binary from
# its crate's folder, and tests rely on that. Integration tests (kind `test`) come first: they are
# the long ones, and starting them early keeps the slowest from ending the run alone.
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics \
    | python3 -c '
import json, os, sys
first, last = [], []
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    entry = os.path.dirname(m["manifest_path"]) + " " + m["executable"]
    (first if "test" in m["target"]["kind"] else last).append(entry)
print("\n".join(first + last + ["doc"]))
' >"$logs/plan"
echo "running $(($(wc -l <"$logs/plan") - 1)) test binaries and the doc tests, $jobs at a time"

run_one() { # run_one "<crate folder> <binary>" | run_one doc
    local name log status=0 start=$SECONDS
    if [ "$1" = doc ]; then
        name="doc tests"
        cargo test --workspace --locked --doc >"$logs/doc.log" 2>&1 || status=$?
        log="$logs/doc.log"
    else
        local dir="${1%% *}" bin="${1#* }"
        name="$(basename "$bin")"
        log="$logs/$name.log"
        (cd "$dir" && "$bin") >"$log" 2>&1 || status=$?
    fi
    # One binary prints at a time, so two ending together do not mix their lines.
    flock "$logs/plan" bash -c 'echo "=== $1 (exit $2, $3 s)"; cat "$4"' _ "$name" "$status" \
        "$((SECONDS - start))" "$log"
    if [ "$status" -ne 0 ]; then echo "$name" >>"$logs/failed"; fi
}
export -f run_one

tr '\n' '\0' <"$logs/plan" | xargs -0 -P "$jobs" -I{} bash -c 'run_one "$1"' _ {}

if [ -s "$logs/failed" ]; then
    echo "FAILED:"
    sed 's/^/  /' "$logs/failed"
    exit 1
fi
echo "all test binaries and the doc tests passed"
