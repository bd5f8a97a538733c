#!/usr/bin/env bash
# Builds VersityGW (github.com/versity/versitygw/cmd/versitygw), the real S3-compatible server that the
# initializers' tests run over a posix folder (tests/harness/objectstore/s3.py), from its Go module at the version
# that go.mod/go.sum beside this script pin. Static (CGO_ENABLED=0), stripped.
# The binary is cached under ${TRAINJOB_CLUSTER_CACHE:-~/.cache/trainjob/cluster}/versitygw-<stamp>/, the stamp
# being a hash of go.mod, go.sum and the Go version, so a warm run takes well under a second. One build at a time
# per cache (parallel test runs may start it together): a second run waits on the lock, then finds it done.
# Prints the binary's path as its only line on stdout; logs go to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${TRAINJOB_CLUSTER_CACHE:-$HOME/.cache/trainjob/cluster}"
log() { echo "s3server/build.sh: $*" >&2; }
command -v go >/dev/null || { log "Go is needed (https://go.dev/dl/); none on PATH"; exit 2; }
mkdir -p "$cache"
gover="$(go env GOVERSION)"
stamp="$(cat "$here/go.mod" "$here/go.sum" | { cat; echo "$gover"; } | sha256sum | cut -c1-16)"
out="$cache/versitygw-$stamp"
if [ -f "$out/.complete" ] && [ -x "$out/versitygw" ]; then
  echo "$out/versitygw"; exit 0
fi
exec 9>"$cache/.versitygw.lock"
flock 9
if [ ! -f "$out/.complete" ] || [ ! -x "$out/versitygw" ]; then
  log "building versitygw into $out"
  start=$SECONDS
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$here" && GOFLAGS="${GOFLAGS:--mod=readonly}" CGO_ENABLED=0 \
    go build -trimpath -ldflags='-s -w' -o "$out.tmp/versitygw" github.com/versity/versitygw/cmd/versitygw) >&2
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv -T "$out.tmp" "$out"
  log "built versitygw in $((SECONDS - start)) s"
fi
echo "$out/versitygw"
