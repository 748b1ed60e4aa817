#!/usr/bin/env bash
# Build the Go client with Debian's Go packages (GOPATH mode, no module download) and run
# its flow against a memsvc started here. Needs: golang-go protobuf-compiler protoc-gen-go
# protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev
# golang-github-golang-protobuf-1-5-dev (without the last, grpc 1.33's old protobuf runtime
# panics on the first call). `.ci/run` installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${MEMSVC_PYTHON:-.venv/bin/python}"
work="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

mkdir -p "$work/src/memsvc.example/flow"
protoc -I proto --go_out="$work/src" --go-grpc_out="$work/src" proto/memsvc/v1/memory.proto
cp clients/go/main.go "$work/src/memsvc.example/flow/"
GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="$work/cache" GOFLAGS= \
  go build -o "$work/flow" memsvc.example/flow

port="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
MEMSVC_EMBED_MODEL=sentence-transformers/all-MiniLM-L6-v2 MEMSVC_METRICS_LISTEN= TQDM_DISABLE=1 \
  "$PY" -m memsvc serve --listen "127.0.0.1:$port" --data-dir "$work/data" --log-level WARNING &
server=$!
for _ in $(seq 360); do
  "$PY" -m memsvc health --target "127.0.0.1:$port" && break
  kill -0 "$server" || { echo "memsvc exited" >&2; exit 1; }
  sleep 0.5
done
"$work/flow" -target "127.0.0.1:$port"
