#!/usr/bin/env bash
# tests/bench/run.sh — what `make bench` runs.
#
# Measures `mesh-executor apply` (the rescue command) against the physical
# floor and CFEngine's cf-agent (docs/benchmarks.md). It:
#   1. refuses to run anywhere but root and a real disk (fsync on tmpfs is free,
#      and the figures would lie);
#   2. installs Debian's cfengine3 when cf-agent is missing, and then makes sure
#      none of its daemons is left enabled or running: the bench runs cf-agent
#      standalone on its own policy and work directory, nothing else;
#   3. builds mesh-executor, the floor, the spawner and the driver (static, as
#      shipped) into $WORK/bin;
#   4. runs the driver, which prints the table and writes $WORK/results.json;
#   5. then runs the link bench (tests/bench/link): the control side, the
#      agent and the executor built with one build id and started as real
#      processes, timing push → applied → report, a flurry, steady RSS and
#      binary sizes; it prints its own table and writes $WORK/link-results.json.
#
# Extra arguments go to the driver, e.g. `bash tests/bench/run.sh -runs 11`;
# MESH_LINK_BENCH_ARGS to the link bench's (e.g. "-pushes 2000").
# MESH_BENCH_PARTS chooses what runs: "apply link" (the default), "apply" or
# "link" (the link bench alone needs no cf-agent).
# Exit status: 0 when every tool produced the declared state, even if a speed
# target was missed (that is printed as MISS); 1 when a tool produced a wrong
# tree or the link did not do its job; 2 when a bench itself could not run
# (the worse of the two benches' statuses).
set -euo pipefail

WORK=${MESH_BENCH_DIR:-/var/tmp/mesh-bench}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
umask 022

say() { printf 'bench: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

[ "$(id -u)" = 0 ] || die "must run as root: mesh-executor applies only root-owned declarations, and cf-agent runs as root"

# --- a real disk -------------------------------------------------------------
mkdir -p "$WORK"
chown root:root "$WORK"
chmod 0755 "$WORK"
fstype=$(stat -f -c %T "$WORK")
case "$fstype" in
	tmpfs | ramfs) die "$WORK is on $fstype; the bench needs a real disk" ;;
	overlayfs) say "warning: $WORK is on overlayfs; the figures are only real if its upper layer is a disk" ;;
esac

# --- cf-agent ------------------------------------------------------------------
install_cfengine() {
	apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=900 cfengine3
}

# quiet_cfengine undoes what the package's install did to the host: Debian's
# cfengine3 enables cfengine3.service and a cf-*.service for each daemon (and
# would start them on a host booted with systemd). Only the units the package
# itself ships are touched, by name.
quiet_cfengine() {
	local units
	units=$(dpkg-query -L cfengine3 2>/dev/null | sed -n 's|^/lib/systemd/system/\(cf[^/]*\.service\)$|\1|p; s|^/usr/lib/systemd/system/\(cf[^/]*\.service\)$|\1|p' | sort -u)
	if [ -n "$units" ] && command -v systemctl >/dev/null; then
		if [ -d /run/systemd/system ]; then
			# shellcheck disable=SC2086 # one word per unit
			systemctl stop $units >/dev/null 2>&1 || true
		fi
		# shellcheck disable=SC2086
		systemctl disable $units >/dev/null 2>&1 || true
	fi
	# Without systemd the package falls back to its init script, which reads
	# /etc/default/cfengine3 (RUN_*=0 by default: nothing starts).
	if [ ! -d /run/systemd/system ] && [ -x /etc/init.d/cfengine3 ]; then
		/etc/init.d/cfengine3 stop >/dev/null 2>&1 || true
	fi
}

# warn_cfengine_daemons only reports: a CFEngine daemon that was running before
# the bench is the host's business, but it would disturb the figures.
warn_cfengine_daemons() {
	local d
	for d in cf-serverd cf-execd cf-monitord; do
		if pgrep -x "$d" >/dev/null 2>&1; then
			say "warning: $d is running (pid $(pgrep -x "$d" | tr '\n' ' ')); left alone, but it may disturb the figures"
		fi
	done
}

PARTS=${MESH_BENCH_PARTS:-apply link}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if want apply; then
if ! command -v cf-agent >/dev/null; then
	say "installing cfengine3 (for cf-agent)"
	if ! install_cfengine; then
		say "install failed; refreshing the package lists and retrying"
		apt-get update -o DPkg::Lock::Timeout=900
		install_cfengine
	fi
	quiet_cfengine
fi
CF_AGENT=$(command -v cf-agent) || die "cf-agent is still missing after installing cfengine3"
warn_cfengine_daemons
fi

# --- binaries --------------------------------------------------------------------
mkdir -p "$WORK/bin"
cd "$ROOT"
say "building into $WORK/bin"
export CGO_ENABLED=0
if want apply; then
	go build -o "$WORK/bin/mesh-executor" ./cmd/mesh-executor
	go build -o "$WORK/bin/mesh-bench-floor" ./tests/bench/floor
	go build -o "$WORK/bin/mesh-bench-spawn" ./tests/bench/spawn
	go build -o "$WORK/bin/mesh-bench" ./tests/bench
fi
if want link; then
	# The three binaries as the Makefile ships them (static, stripped), one
	# build id for all: the agent leaves when the executor's build differs.
	LINK_VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
	LINK_BUILD="$LINK_VERSION-bench"
	mkdir -p "$WORK/bin/link"
	chmod 0755 "$WORK/bin" "$WORK/bin/link"
	for c in mesh-control mesh-executor mesh-agent; do
		go build -trimpath -ldflags "-s -w -X main.version=$LINK_VERSION -X main.build=$LINK_BUILD" -o "$WORK/bin/link/$c" "./cmd/$c"
	done
	go build -o "$WORK/bin/mesh-bench-link" ./tests/bench/link
fi

rc=0
if want apply; then
	"$WORK/bin/mesh-bench" \
		-dir "$WORK" \
		-executor "$WORK/bin/mesh-executor" \
		-floor "$WORK/bin/mesh-bench-floor" \
		-spawn "$WORK/bin/mesh-bench-spawn" \
		-cf-agent "$CF_AGENT" \
		"$@" || rc=$?
fi
if want link; then
	link_rc=0
	# shellcheck disable=SC2086 # one word per argument
	"$WORK/bin/mesh-bench-link" \
		-dir "$WORK" \
		-bin "$WORK/bin/link" \
		-build "$LINK_BUILD" \
		${MESH_LINK_BENCH_ARGS:-} || link_rc=$?
	if [ "$link_rc" -gt "$rc" ]; then rc=$link_rc; fi
fi
exit "$rc"
