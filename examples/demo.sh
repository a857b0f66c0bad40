#!/usr/bin/env bash
# make demo: the main job on one machine. A control side with its embedded
# NATS broker, the executor as root, the agent dropping to an unprivileged
# user (nobody, so the demo adds no user to this machine), the machine
# enrolled with a one-time token, a declaration signed and pushed, the machine changed — on a scratch "machine" under
# /tmp/mesh-demo (the examples' paths are absolute there) — and the report
# read back on the control side. Then the rescue command, driving the
# executor directly with a local file. Everything it started is stopped,
# and the scratch directory removed, when it ends. Each step that should
# work must, each refusal shown must be refused: anything else fails the
# demo (tests/e2e runs it, MESH_DEMO_DIR naming another scratch directory).
set -euo pipefail
BIN=$(readlink -f "${1:-bin}")
HERE=$(cd "$(dirname "$0")" && pwd)
D=${MESH_DEMO_DIR:-/tmp/mesh-demo}
if [ "$(id -u)" != 0 ]; then echo "make demo runs as root (the executor does)"; exit 1; fi
# One demo per scratch directory: a second would remove the first's.
exec 9>"$D.lock"
if ! flock -n 9; then echo "make demo: another demo is running in $D (it holds $D.lock); wait for it, or give MESH_DEMO_DIR another directory" >&2; exit 1; fi
rm -rf "$D"; install -d -m 0755 "$D" "$D/machine" "$D/machine/etc" "$D/machine/srv"
install -d -m 0700 "$D/control" "$D/executor" "$D/decl"
# The examples' paths are under /tmp/mesh-demo: moved to $D.
for f in mesh-v1.json mesh-v2.json demo.json; do sed "s#/tmp/mesh-demo#$D#g" "$HERE/$f" >"$D/decl/$f"; chmod 0600 "$D/decl/$f"; done
pids=()
# On success the scratch directory goes; on a failure its logs stay, and
# the demo says where (control.log, executor.log, agent.log).
cleanup() {
	status=$?
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "$status" -eq 0 ]; then
		rm -rf "$D"
	else
		echo "make demo failed (exit $status): its logs are kept in $D (control.log, executor.log, agent.log)" >&2
	fi
}
trap cleanup EXIT
# Colour only on a terminal, and never with NO_COLOR set (no-color.org).
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then bold=$'\033[1m' cyan=$'\033[36m' plain=$'\033[0m'; else bold= cyan= plain=; fi
# step runs a command that must work; refused one that must be refused.
step() { printf '\n%s$ %s%s\n' "$bold" "$*" "$plain"; "$@"; }
refused() {
	printf '\n%s$ %s%s\n' "$bold" "$*" "$plain"
	if "$@"; then echo "make demo: that should have been refused" >&2; return 1; else echo "(refused: exit status $?)"; fi
}
say() { printf '\n%s# %s%s\n' "$cyan" "$*" "$plain"; }
port=$(( 20000 + RANDOM % 20000 ))
CTL="--dir $D/control"

say "The control side: keys, a broker certificate, and an embedded NATS broker with JetStream."
step "$BIN/mesh-control" init $CTL --url "tls://127.0.0.1:$port"
"$BIN/mesh-control" serve $CTL --listen "127.0.0.1:$port" >"$D/control.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do "$BIN/mesh-control" nodes $CTL >/dev/null 2>&1 && break; sleep 0.1; done

say "The machine, as after installing the package: the executor (root) listens on a local socket only;"
say "the agent (nobody, no capabilities) is hosted: no identity, it dials nothing."
"$BIN/mesh-executor" serve --state "$D/executor" --socket "$D/run/executor.sock" --agent-user nobody --drift 3s >"$D/executor.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do [ -S "$D/run/executor.sock" ] && break; sleep 0.1; done
"$BIN/mesh-agent" --config "$D/agent-state/config.json" --socket "$D/run/executor.sock" --user nobody --state "$D/agent-state" --heartbeat 1s --enrol-poll 500ms >"$D/agent.log" 2>&1 & pids+=($!)

say "Enrolment: the control side prints a one-time token, once; a person carries it to the machine."
TOKEN=$("$BIN/mesh-control" token issue --new --name demo $CTL --ttl 10m)
printf '%s\n' "$TOKEN"
say "mesh-executor enrol reads it on standard input (never the command line), keeps its secret, makes the"
say "node's keys, and waits while the agent asks the broker with the token's one-time credential."
printf '%s\n' "$TOKEN" | step "$BIN/mesh-executor" enrol --state "$D/executor" --wait 60s
for _ in $(seq 100); do "$BIN/mesh-control" nodes $CTL 2>/dev/null | grep -q " enrolled " && break; sleep 0.2; done
sleep 1
step "$BIN/mesh-control" node show demo $CTL
say "The token is spent: presented again, the control side says so."
printf '%s\n' "$TOKEN" | refused "$BIN/mesh-executor" enrol --state "$D/executor" --wait 30s

# The motd is already there: the host keeps its original and gives it back.
printf 'the machine'"'"'s own motd\n' > "$D/machine/etc/motd"
say "Declare: the control side gives it the next sequence, signs it, publishes it, and (--wait) prints the node's report."
step "$BIN/mesh-control" declare demo "$D/decl/mesh-v1.json" $CTL --wait=60s
step find "$D/machine" -type f

say "Someone edits app.conf by hand; the drift timer (3 s here, 10 min by default) puts it right."
echo 'workers = 64' >> "$D/machine/etc/app/app.conf"
sleep 4
step cat "$D/machine/etc/app/app.conf"
if grep -q 'workers = 64' "$D/machine/etc/app/app.conf"; then echo "make demo: the drift was not put right" >&2; exit 1; fi

say "A second declaration: what the link applied and no longer declares is removed or given back."
step "$BIN/mesh-control" declare demo "$D/decl/mesh-v2.json" $CTL --wait=60s
step "$BIN/mesh-control" reports demo $CTL --last 2
step "$BIN/mesh-control" nodes $CTL
step "$BIN/mesh-executor" owned --state "$D/executor"

say "Rescue: root drives the executor directly with a local file (it may carry an action; the link may not)."
install -m 0600 "$D/decl/demo.json" "$D/decl/rescue.json"
say "On an enrolled node a local file must name the node: this one names none, and is refused."
refused "$BIN/mesh-executor" apply --state "$D/executor" "$D/decl/rescue.json"
sed 's/"node": ""/"node": "demo"/' "$D/decl/demo.json" > "$D/decl/rescue.json"
say "Named, it is applied — recorded as the local source, so it undoes nothing the link applied."
step "$BIN/mesh-executor" apply --state "$D/executor" "$D/decl/rescue.json"
step "$BIN/mesh-executor" plan --state "$D/executor" "$D/decl/rescue.json"
say "An unsafe local file (writable by others) is refused; nothing changes."
install -m 0666 "$D/decl/demo.json" "$D/decl/open.json"
refused "$BIN/mesh-executor" apply --state "$D/executor" "$D/decl/open.json"
step "$BIN/mesh-executor" status --state "$D/executor"
say "What this machine can be asked to do:"
step "$BIN/mesh-executor" profile
