#!/usr/bin/env bash
# examples/two-nodes.sh — a control side and two nodes on one machine, to
# try the mesh before there are machines to spare: each node is what a
# machine has (its own executor state, socket and agent state), and its
# executor runs in a network namespace of its own with its own
# /run/wireguard, so an overlay set later is each node's alone. The agents
# stay in the machine's network, where the broker listens on loopback.
#
#   examples/two-nodes.sh [BINDIR]          as root; BINDIR holds the four binaries (default /usr/bin)
#   TWO_NODES_DIR=/tmp/x examples/two-nodes.sh   another scratch directory (default /tmp/two-nodes)
#   TWO_NODES_ONCE=1 ...                    stop everything once both nodes have applied (tests/e2e runs it so)
#
# It enrols both nodes with one-time tokens, declares a file to each, and
# waits for each report. Then it prints the commands to try, and keeps the
# mesh running until Ctrl-C; everything it started (processes, network
# namespaces, the bind mounts) ends with it, and the scratch directory is
# kept for its logs.
set -euo pipefail
BIN=$(readlink -f "${1:-/usr/bin}")
D=${TWO_NODES_DIR:-/tmp/two-nodes}
if [ "$(id -u)" != 0 ]; then echo "two-nodes.sh runs as root (the executors do, and it makes network namespaces)" >&2; exit 1; fi
for b in mesh-control mesh-executor mesh-agent; do
	[ -x "$BIN/$b" ] || { echo "two-nodes.sh: no $BIN/$b (give the directory of the binaries: examples/two-nodes.sh DIR)" >&2; exit 1; }
done
for t in ip unshare nsenter flock; do
	command -v "$t" >/dev/null || { echo "two-nodes.sh: needs $t (iproute2, util-linux)" >&2; exit 1; }
done
# One run per scratch directory: a second would take the first's sockets.
install -d -m 0755 "$(dirname "$D")"
exec 9>"$D.lock"
if ! flock -n 9; then echo "two-nodes.sh: another run uses $D (it holds $D.lock)" >&2; exit 1; fi
rm -rf "$D"; install -d -m 0755 "$D" "$D/logs"
install -d -m 0700 "$D/control"
install -d -m 0755 /run/wireguard /run/netns

pids=() netns=()
cleanup() {
	status=$?
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for ns in "${netns[@]}"; do
		# What lives on in the namespace (an overlay's wireguard-go) ends
		# with it.
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
	if [ "$status" -ne 0 ]; then echo "two-nodes.sh failed (exit $status): the logs are in $D/logs" >&2; fi
}
trap cleanup EXIT
trap 'exit 0' INT TERM

port=$(( 20000 + RANDOM % 20000 ))
CTL=(--dir "$D/control")
echo "# the control side: $D/control, its broker on 127.0.0.1:$port"
"$BIN/mesh-control" init "${CTL[@]}" --url "tls://127.0.0.1:$port" >"$D/logs/init.log" 2>&1
"$BIN/mesh-control" serve "${CTL[@]}" --listen "127.0.0.1:$port" >"$D/logs/serve.log" 2>&1 & pids+=($!)
for _ in $(seq 150); do "$BIN/mesh-control" nodes "${CTL[@]}" >/dev/null 2>&1 && break; sleep 0.2; done
"$BIN/mesh-control" nodes "${CTL[@]}" >/dev/null

for n in n1 n2; do
	N="$D/$n"
	ns="two-nodes-$n-$$"
	install -d -m 0755 "$N" "$N/run" "$N/wireguard" "$N/files"
	install -d -m 0700 "$N/executor"
	ip netns add "$ns"; netns+=("$ns")
	# The executor: root, in the node's network namespace, in a mount
	# namespace where the node's directory is /run/wireguard.
	unshare --mount --propagation private -- /bin/sh -c \
		'wg=$1 ns=$2; shift 2; mount --bind "$wg" /run/wireguard && exec nsenter --net="/run/netns/$ns" -- "$@"' sh "$N/wireguard" "$ns" \
		"$BIN/mesh-executor" serve --state "$N/executor" --socket "$N/run/executor.sock" \
		--agent-user nobody --agent-state "$N/agent" >"$D/logs/$n-executor.log" 2>&1 & pids+=($!)
	for _ in $(seq 150); do [ -S "$N/run/executor.sock" ] && break; sleep 0.2; done
	[ -S "$N/run/executor.sock" ] || { echo "two-nodes.sh: $n's executor did not start (its log: $D/logs/$n-executor.log)" >&2; exit 1; }
	# The agent: the machine's network, dropping to nobody.
	"$BIN/mesh-agent" --socket "$N/run/executor.sock" --user nobody --state "$N/agent" \
		--config "$N/agent/config.json" --heartbeat 2s --enrol-poll 500ms >"$D/logs/$n-agent.log" 2>&1 & pids+=($!)
	echo "# $n: enrolled with a one-time token (mesh-control token issue, then mesh-executor enrol)"
	token=$("$BIN/mesh-control" token issue --new --name "$n" "${CTL[@]}" 2>/dev/null)
	printf '%s\n' "$token" | "$BIN/mesh-executor" enrol --state "$N/executor" --socket "$N/run/executor.sock" --wait 60s
done

for n in n1 n2; do
	N="$D/$n"
	install -m 0600 /dev/null "$D/$n.json"
	printf '{"version":1,"resources":[{"module":"hello","id":"motd","type":"file","path":"%s/files/motd","content":"hello from the control side to %s\\n"}]}\n' "$N" "$n" >"$D/$n.json"
	echo "# $n: a declaration, and its report"
	"$BIN/mesh-control" declare "$n" "$D/$n.json" "${CTL[@]}" --wait=90s
	grep -q "to $n" "$N/files/motd" || { echo "two-nodes.sh: $n's file is not as declared" >&2; exit 1; }
done
"$BIN/mesh-control" nodes "${CTL[@]}"

if [ -n "${TWO_NODES_ONCE:-}" ]; then exit 0; fi
cat <<EOF

The mesh runs; Ctrl-C ends it. Try, in another terminal:
  $BIN/mesh-control nodes --dir $D/control
  $BIN/mesh-control reports n1 --dir $D/control
  $BIN/mesh-control overlay set --dir $D/control          # then each node's overlay, in its namespace
  $BIN/mesh-executor status --state $D/n1/executor
  $BIN/mesh-executor owned --state $D/n2/executor
The logs: $D/logs.
EOF
while :; do sleep 3600 & wait $!; done
