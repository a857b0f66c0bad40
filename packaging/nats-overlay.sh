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
# docs/benchmarks.md): in a fan-out, serve's CPU in
# flushOutbound, in growing stacks and in shrinking them went from 1.86 s to
# 0.78 s (a third of serve's CPU to a seventh), its peak memory from 1,211 to 938
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
case $# in
0) ;;
*)
	case $1 in
	-h | --help) echo "usage: nats-overlay.sh   (no arguments; NATS_BASE and GO from the environment) — prints the go.work to build with" ;;
	*) echo "nats-overlay.sh: takes no arguments, got \"$*\" (NATS_BASE and GO come from the environment; --help)" >&2 && exit 2 ;;
	esac
	exit 0
	;;
esac
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
if [ -z "${NATS_BASE:-}" ]; then
	cache=$($GO env GOCACHE)
	case $cache in
	/*) ;;
	*) echo "nats-overlay.sh: GOCACHE is \"$cache\", not a directory; set NATS_BASE to one of yours" >&2; exit 1 ;;
	esac
	NATS_BASE=$(dirname "$cache")/nox-mesh-host-nats
fi
# Ours alone: a directory another user made (a shared /tmp) could hold a
# copy of their choosing.
mkdir -p -m 700 "$NATS_BASE"
if [ ! -O "$NATS_BASE" ] || [ -n "$(find "$NATS_BASE" -maxdepth 0 -perm /022)" ]; then
	echo "nats-overlay.sh: $NATS_BASE is not this user's alone; remove it or set NATS_BASE" >&2
	exit 1
fi
base=$(cd "$NATS_BASE" && pwd)
name=$ver-$(printf '%s' "$stamp" | sha256sum | cut -c1-12)
copy=$base/$name
dir=$base/work-$(printf '%s' "$root" | sha256sum | cut -c1-12)
mkdir -p "$dir"
# The copy is read-only, as the module cache is, and checked against the
# sums it was made with at every build: an edit (an editor's jump into the
# broker's source) is refused, not built.
valid() { [ "$(cat "$1/.made-from" 2>/dev/null)" = "$stamp" ] && (cd "$1" && sha256sum -c --quiet --strict .sums >/dev/null 2>&1); }
if ! valid "$copy"; then
	# Made aside and moved in whole: two builds at once each make their
	# own, and the first to move it in wins.
	tmp=$copy.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp"
	(cd "$src" && find . -type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name LICENSE \) \
		! -path './test/*' -print0 | xargs -0 cp --parents --no-preserve=mode -t "$tmp")
	awk -v p="$PATTERN" -v r="$REPLACE" '$0 == p { print r; next } { print }' \
		"$src/server/client.go" > "$tmp/server/client.go"
	(cd "$tmp" && find . -type f ! -name .sums -print0 | sort -z | xargs -0 sha256sum > .sums)
	printf '%s\n' "$stamp" > "$tmp/.made-from"
	chmod -R a-w "$tmp"
	if [ -e "$copy" ] && ! valid "$copy"; then
		chmod -R u+w "$copy" && rm -rf "$copy" # half made, or changed since
	fi
	if ! mv -T "$tmp" "$copy" 2>/dev/null; then
		chmod -R u+w "$tmp" && rm -rf "$tmp"
	fi
	if ! valid "$copy"; then
		echo "nats-overlay.sh: $copy is not the copy it should be" >&2
		exit 1
	fi
fi
gover=$(awk '$1 == "go" { print $2; exit }' go.mod)
cat > "$dir/go.work.tmp.$$" <<EOF
go $gover

use "$root"

replace $mod $ver => ../$name
EOF
mv "$dir/go.work.tmp.$$" "$dir/go.work"
echo "$dir/go.work"
