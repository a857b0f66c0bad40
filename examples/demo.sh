#!/usr/bin/env bash
# make demo: the rescue command drives the executor directly with a local
# file, on a scratch "machine" under /tmp/mesh-demo (the example's paths are
# absolute there; the executor has no path-rebasing option).
set -euo pipefail
EXE=${1:-bin/mesh-executor}
EXE=$(readlink -f "$EXE")
HERE=$(cd "$(dirname "$0")" && pwd)
D=/tmp/mesh-demo
if [ "$(id -u)" != 0 ]; then echo "make demo runs as root (the executor does)"; exit 1; fi
rm -rf "$D"; install -d -m 0755 "$D" "$D/machine" "$D/machine/etc"
install -d -m 0700 "$D/decl"
# The motd is already there: the host keeps its original and gives it back.
printf 'the machine'"'"'s own motd\n' > "$D/machine/etc/motd"
# A local file is applied only if root owns it and nobody else may write it.
install -m 0600 "$HERE/demo.json" "$D/decl/demo.json"
install -m 0600 "$HERE/demo-empty.json" "$D/decl/empty.json"
S="--state $D/state"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@" || echo "(exit status $?)"; }
step "$EXE" version
step "$EXE" apply $S "$D/decl/demo.json"
step "$EXE" apply $S "$D/decl/demo.json"          # idempotent: nothing to do
echo 'workers = 64' >> "$D/machine/etc/app/app.conf"; chmod 0666 "$D/machine/etc/app/app.conf"
printf '\n(someone edits app.conf by hand and opens its mode)\n'
step "$EXE" plan $S "$D/decl/demo.json"           # what the next apply would do; touches nothing
step "$EXE" apply $S "$D/decl/demo.json"          # drift repaired
step "$EXE" owned $S
step "$EXE" status $S
printf '\n(an unsafe local file is refused; nothing changes)\n'
install -m 0666 "$HERE/demo.json" "$D/decl/open.json"
step "$EXE" apply $S "$D/decl/open.json"
step "$EXE" apply $S "$D/decl/empty.json"         # undeclare everything
step cat "$D/machine/etc/motd"                    # the original is back
step find "$D/machine"
step "$EXE" profile
