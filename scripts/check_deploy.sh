#!/usr/bin/env bash
# Checks of the operations kit in deploy/:
#   promtool check config / check rules / test rules   deploy/prometheus/
#   promtool check rules over every dashboard query     deploy/grafana/
#   systemd-analyze verify and security                 deploy/systemd/
#   bash -n                                             deploy/backup/
# promtool comes from Debian's `prometheus` package: when it is not on PATH
# the package is downloaded with apt-get (no install: no server is started)
# and promtool alone is unpacked into .tools/bin/. systemd-analyze comes with
# Debian's `systemd` package (installed with apt-get when missing, as root).
# Run by scripts/test.sh; runnable alone: `bash scripts/check_deploy.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

promtool=$(command -v promtool || true)
if [ -z "$promtool" ] && [ -x .tools/bin/promtool ]; then
    promtool=$ROOT/.tools/bin/promtool
fi
if [ -z "$promtool" ]; then
    echo "== promtool: not on PATH; unpacking it from Debian's prometheus package"
    (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get download prometheus >/dev/null; }; })
    mkdir -p "$work/deb" .tools/bin
    dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work/deb" ./usr/bin/promtool
    install -m 0755 "$work/deb/usr/bin/promtool" .tools/bin/promtool
    promtool=$ROOT/.tools/bin/promtool
fi
echo "== $("$promtool" --version 2>&1 | head -1)"
(cd deploy/prometheus && "$promtool" check config prometheus.yml \
    && "$promtool" check rules lethe-alerts.yml \
    && "$promtool" test rules lethe-alerts.test.yml)

echo "== dashboard queries (as recording rules, through promtool)"
python3 - "$work/dashboard-rules.yml" <<'PY'
import json, sys
dash = json.load(open("deploy/grafana/lethe-dashboard.json"))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
assert exprs, "no queries in the dashboard"
with open(sys.argv[1], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, expr in enumerate(exprs):
        expr = expr.replace("$instance", ".*")
        out.write(f"      - record: dashboard:query{i}\n        expr: {json.dumps(expr)}\n")
print(f"{len(exprs)} queries")
PY
"$promtool" check rules "$work/dashboard-rules.yml"

if ! command -v systemd-analyze >/dev/null; then
    echo "== systemd-analyze: not found; installing Debian's systemd package"
    apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
echo "== systemd-analyze verify deploy/systemd/lethe.service ($(systemd-analyze --version | head -1))"
# An offline root: the system's own units (for the targets it names) and a
# stand-in for the ExecStart binary, so nothing is installed on this machine.
sdroot=$work/root
mkdir -p "$sdroot/etc/systemd/system" "$sdroot/usr/lib/systemd" "$sdroot/opt/lethe/venv/bin"
cp -r /usr/lib/systemd/system "$sdroot/usr/lib/systemd/"
printf '#!/bin/sh\n' >"$sdroot/opt/lethe/venv/bin/lethe"
chmod 0755 "$sdroot/opt/lethe/venv/bin/lethe"
cp deploy/systemd/lethe.service "$sdroot/etc/systemd/system/"
# verify only logs what it ignores (unknown keys, bad values): any output fails.
out=$(systemd-analyze verify --root="$sdroot" lethe.service 2>&1) || { echo "$out" >&2; exit 1; }
if [ -n "$out" ]; then
    echo "$out" >&2
    exit 1
fi
# The exposure score (0 = locked down, 10 = exposed), at most 2.0.
systemd-analyze security --offline=yes --root="$sdroot" --threshold=20 lethe.service \
    | tail -1
echo "== deploy/backup"
bash -n deploy/backup/lethe-backup.sh
echo "deploy: prometheus config, alert rules and their tests, dashboard queries, systemd unit passed"
