#!/usr/bin/env bash
# Checks the alert rules (syntax and promtool unit tests) and the Alertmanager config.
# Needs promtool and amtool (Debian packages prometheus, prometheus-alertmanager).
set -euo pipefail
cd "$(dirname "$0")"
promtool check rules chronoshard.rules.yml
promtool test rules chronoshard.tests.yml
amtool check-config alertmanager.yml
