package control

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// next says, on standard error, the command that comes next, as kubeadm
// does after init: a person raising a control side for the first time
// reads what to run rather than looking it up. Standard output is left to
// what scripts parse.
func (c *cli) next(command string) {
	fmt.Fprintf(c.stderr, "next: %s\n", command)
}

// dirFlag is --dir as the next command needs it: nothing when it is the
// default the next command finds by itself.
func (c *cli) dirFlag() string {
	if c.dir == DefaultDir() {
		return ""
	}
	return " --dir " + shellQuote(c.dir)
}

// shellQuote quotes s for a POSIX shell when it needs it, so a printed
// command can be pasted as it is.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"$`\\|&;<>()*?[]#~!{}") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// nextAfterServe, once serve is up, says how to enrol the first node —
// only while the mesh has none: a serve restarted on a running mesh says
// nothing more. A token issued already and still usable is pointed at
// instead of a second one. It reads the registry over its own connection
// and says nothing when that fails (serve's log says why it cannot work).
func (c *cli) nextAfterServe(k *Keys, url, listen string) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	cl, err := Connect(ctx, k, url, c.log)
	if err != nil {
		return
	}
	defer cl.Close()
	recs, err := cl.records(ctx)
	if err != nil || len(recs) > 0 {
		return
	}
	ts, err := cl.Tokens(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, t := range ts {
		if t.State(now) == TokenUsable {
			c.next(fmt.Sprintf("mesh-executor enrol, as root on the machine token %s is for (usable until %s; mesh-control token list%s)",
				t.ID, t.Expires.Local().Format(time.RFC3339), c.dirFlag()))
			return
		}
	}
	hint, where := brokerURLHint(k, listen)
	c.next(fmt.Sprintf("mesh-control token issue --new --name NAME%s%s    # the first node's token (NAME: the node it makes%s); then, on that machine as root: mesh-executor enrol",
		hint, c.dirFlag(), where))
}

// brokerURLHint is the --broker-url a token needs to reach this broker
// from another machine, and what its placeholder means: none when the key
// directory's broker URL names an address others reach already, or when
// the broker listens on loopback alone (only this machine reaches it, by
// the default).
func brokerURLHint(k *Keys, listen string) (flag, where string) {
	if h, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(k.BrokerURL, "tls://"), "nats://")); err != nil || !isLoopback(h) {
		return "", ""
	}
	if listen == "" {
		listen = strings.TrimPrefix(strings.TrimPrefix(k.BrokerURL, "tls://"), "nats://")
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil || isLoopback(host) {
		return "", ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return " --broker-url tls://" + net.JoinHostPort("ADDRESS", port), "; ADDRESS: where that machine reaches this broker"
	}
	return " --broker-url tls://" + net.JoinHostPort(host, port), ""
}

// isLoopback says whether host names this machine alone.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}
