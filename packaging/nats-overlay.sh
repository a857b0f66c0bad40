#!/usr/bin/env bash
# nats-overlay.sh: makes a Go workspace of this module (go.work) that
# builds the embedded broker (nats-server, linked by mesh-control) with one
# line changed, and prints the workspace file's absolute path. The Makefile
# hands it to every go command it runs (GOWORK); a go command run without
# it builds the broker as published, which works the same, only slower at
# scale.
#
# The change: nats-server v2.15's (*client).flushOutbound copies a
# connection's pending buffers into a local array of 1,024 slices, 24 KiB on
# the stack of whichever goroutine writes: it is zeroed at every write, and
# every connection's writer grows to 32 KiB the first time it writes after
# a collection shrank it. Measured at 10,000 nodes (make bench-scale,
# docs/benchmarks.md "Session 7"): in a fan-out, serve's CPU in
# flushOutbound, in growing stacks and in shrinking them went from 1.86 s to
# 0.78 s (a fifth of all serve's CPU), its peak memory from 1,211 to 938
# MiB. With 8 slices on the stack the rare longer list is appended to the
# heap: the same writes, in the same order.
#
# The copy is the module cache's own module (its non-test Go files and
# go.mod) with the line changed, made here and never committed, beside the
# Go build cache (NATS_BASE, by default GOCACHE's parent/nox-mesh-host-nats):
# outside the repository, where gofmt, grep and the tests that walk the tree
# would take it for ours. Each checkout's go.work sits there too and names
# the copy by a relative path, so the binaries' build information says the
# same wherever they are built ("=> ../v2.15.2-<hash>"). The script refuses
# when the line it changes is not there exactly once (a nats-server
# upgrade: look again, then change PATTERN). `go build -overlay` cannot do
# this: it refuses to replace files in the module cache.
set -euo pipefail
GO=${GO:-go}
mod=github.com/nats-io/nats-server/v2
PATTERN='	var _orig [nbMaxVectorSize][]byte'
REPLACE='	var _orig [8][]byte // nox-mesh-host: packaging/nats-overlay.sh says why'

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The module's version and directory as this module resolves them
# (downloaded if missing); never through a workspace of ours.
export GOWORK=off GOFLAGS=
ver=$($GO list -m -f '{{.Version}}' "$mod")
src=$($GO list -m -f '{{.Dir}}' "$mod" 2>/dev/null || true)
if [ -z "$src" ] || [ ! -f "$src/server/client.go" ]; then
	$GO mod download "$mod" >&2
	src=$($GO list -m -f '{{.Dir}}' "$mod")
fi
n=$(grep -cxF -- "$PATTERN" "$src/server/client.go" || true)
if [ "$n" != 1 ]; then
	echo "nats-overlay.sh: $src/server/client.go has the line to change $n times, not once (a nats-server upgrade?)" >&2
	exit 1
fi
stamp="$ver $PATTERN -> $REPLACE"
base=${NATS_BASE:-$(dirname "$($GO env GOCACHE)")/nox-mesh-host-nats}
mkdir -p "$base"
base=$(cd "$base" && pwd)
name=$ver-$(printf '%s' "$stamp" | sha256sum | cut -c1-12)
copy=$base/$name
dir=$base/work-$(printf '%s' "$root" | sha256sum | cut -c1-12)
mkdir -p "$dir"
if [ "$(cat "$copy/.made-from" 2>/dev/null)" != "$stamp" ]; then
	# Made aside and moved in whole: two builds at once each make their
	# own, and the first to move it in wins.
	tmp=$copy.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp"
	(cd "$src" && find . -type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name LICENSE \) \
		! -path './test/*' -print0 | xargs -0 cp --parents --no-preserve=mode -t "$tmp")
	awk -v p="$PATTERN" -v r="$REPLACE" '$0 == p { print r; next } { print }' \
		"$src/server/client.go" > "$tmp/server/client.go"
	printf '%s\n' "$stamp" > "$tmp/.made-from"
	if [ -e "$copy" ] && [ "$(cat "$copy/.made-from" 2>/dev/null)" != "$stamp" ]; then
		rm -rf "$copy" # half made by a build that was stopped
	fi
	mv -T "$tmp" "$copy" 2>/dev/null || rm -rf "$tmp"
fi
gover=$(awk '$1 == "go" { print $2; exit }' go.mod)
cat > "$dir/go.work.tmp.$$" <<EOF
go $gover

use $root

replace $mod $ver => ../$name
EOF
mv "$dir/go.work.tmp.$$" "$dir/go.work"
echo "$dir/go.work"
