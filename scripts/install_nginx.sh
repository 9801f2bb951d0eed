#!/usr/bin/env bash
# Install nginx from Debian (package nginx-light: grpc_pass, hash consistent,
# map, HTTP/2 and TLS) for tests/test_shards.py, which runs three `lethe serve`
# behind it on loopback. Run by scripts/test.sh; alone:
# `bash scripts/install_nginx.sh`. Only installs: the test starts its own
# nginx (in the foreground, its config and files in a temporary directory);
# the package's own service (its default site on port 80, where the system
# starts services) is neither used nor touched.
#
# Not root: under CI=true that is an error; otherwise it says how and the
# shard tests skip, saying why.
set -euo pipefail
DEB=nginx-light
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    if [ "${CI:-}" = true ]; then
        echo "shards: nginx is missing and this is not root: apt-get install $DEB" >&2
        exit 1
    fi
    echo "shards: SKIPPED — install as root: apt-get install $DEB" >&2
    exit 0
fi
echo "== shards: apt-get install $DEB"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "$DEB" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$DEB" >/dev/null; }
