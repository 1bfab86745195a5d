#!/usr/bin/env bash
# Local monitoring beside `chronoshard dev` (./scripts/dev.sh): a Prometheus that scrapes the
# platform's /metrics and evaluates alerts/chronoshard.rules.yml, and an Alertmanager with
# alerts/alertmanager.yml, both in a state directory of their own, listening on loopback.
# Installs what is missing (Debian's prometheus and prometheus-alertmanager packages; a service
# the package may start is neither used nor touched). Ctrl-C stops both.
#
#   scripts/monitor.sh [--target HOST:PORT]... [--state DIR] [--prometheus ADDR]
#                      [--alertmanager ADDR] [--scrape-interval 5s]
#
# --target: what serves /metrics (default 127.0.0.1:8080, dev's control plane, which in dev
# serves every part's metrics); repeat it for shard nodes and workers run with --metrics.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

targets=()
state="$ROOT/chronoshard-monitor"
prom_addr=127.0.0.1:9090
am_addr=127.0.0.1:9093
interval=5s
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=("$2"); shift 2 ;;
    --state) state=$2; shift 2 ;;
    --prometheus) prom_addr=$2; shift 2 ;;
    --alertmanager) am_addr=$2; shift 2 ;;
    --scrape-interval) interval=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(127.0.0.1:8080)

ensure_prometheus_tools
mkdir -p "$state/prometheus" "$state/alertmanager"
state=$(cd "$state" && pwd)

# The config, written afresh at each start: JSON is YAML.
target_list=$(printf '"%s",' "${targets[@]}")
cat >"$state/prometheus.yml" <<CONFIG
{
  "global": {"scrape_interval": "$interval", "evaluation_interval": "$interval"},
  "rule_files": ["$ROOT/alerts/chronoshard.rules.yml"],
  "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["$am_addr"]}]}]},
  "scrape_configs": [{"job_name": "chronoshard", "static_configs": [{"targets": [${target_list%,}]}]}]
}
CONFIG

pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

# No cluster port: this Alertmanager is alone.
"$CHRONOSHARD_ALERTMANAGER" --config.file="$ROOT/alerts/alertmanager.yml" \
  --storage.path="$state/alertmanager" --web.listen-address="$am_addr" \
  --cluster.listen-address= >"$state/alertmanager.log" 2>&1 &
pids+=($!)
"$CHRONOSHARD_PROMETHEUS" --config.file="$state/prometheus.yml" \
  --storage.tsdb.path="$state/prometheus" --web.listen-address="$prom_addr" \
  >"$state/prometheus.log" 2>&1 &
pids+=($!)

# Waits up to 30 s for URL to answer 200; says which log to read if it does not.
ready() {
  local url=$1 log=$2
  for _ in $(seq 300); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "error: $url did not answer; the end of $log:" >&2
  tail -n 20 "$log" >&2
  return 1
}
ready "http://$am_addr/-/ready" "$state/alertmanager.log"
ready "http://$prom_addr/-/ready" "$state/prometheus.log"

cat <<DONE
chronoshard monitoring is up (state and logs in $state):
  Prometheus:   http://$prom_addr  (scraping ${targets[*]} every $interval; Status > Targets, Alerts)
  Alertmanager: http://$am_addr  (alerts/alertmanager.yml; its webhook URL is a placeholder)
  Grafana:      point a Prometheus data source at http://$prom_addr, then import
                grafana/dashboards/*.json, or provision them: grafana/README.md
Ctrl-C stops both.
DONE
# Either one ending ends the other.
wait -n "${pids[@]}"
echo "error: prometheus or alertmanager stopped; see $state/*.log" >&2
exit 1
