package firewall

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Watch in a bare network namespace, against the kernel: rules and tables
// added are no loss; the host's firewall loaded again ("flush ruleset"
// then its rules, one burst) is one, said once after the burst; a single
// rule deleted by hand is one too; and the watch ends when asked.
func TestWatchSaysWhenTheRulesetLosesSomething(t *testing.T) {
	_, sh := bareNetns(t)
	ns, err := os.Open(fmt.Sprintf("/run/netns/fwtest-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx, cancel := context.WithCancel(t.Context())
	lost := make(chan time.Time, 16)
	ended := make(chan error, 1)
	go func() {
		ended <- Watch(ctx, 200*time.Millisecond, func() { lost <- time.Now() }, int(ns.Fd()))
	}()
	// The watch listens once it has joined the kernel's group: a table
	// deleted until one is said.
	for heard, give := false, time.Now().Add(30*time.Second); !heard; {
		if time.Now().After(give) {
			t.Fatal("a table deleted was never said")
		}
		sh(`nft add table inet probe; nft delete table inet probe`)
		select {
		case <-lost:
			heard = true
		case <-time.After(time.Second):
		}
	}

	// The host's chains made (after a flush a while before: a stop, then
	// a start): looked at once, where the openings belong.
	sh(`nft -f - <<'EOF'
` + found + `EOF`)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the host's chains made were never said")
	}
	sh(`nft add rule inet filter input tcp dport 10001 accept comment '"nox-mesh-host web.http"'`)
	select {
	case at := <-lost:
		t.Fatalf("a rule added was taken for a loss (at %v)", at)
	case <-time.After(time.Second):
	}

	// The host's firewall loaded again: one burst, one call.
	sh(`nft -f - <<'EOF'
flush ruleset
` + found + `EOF`)
	var first time.Time
	select {
	case first = <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("the ruleset flushed and loaded again was never said")
	}
	select {
	case at := <-lost:
		t.Fatalf("one reload said twice (%v, then %v)", first, at)
	case <-time.After(time.Second):
	}

	// Rules that churn without pause (a kube-proxy's: a deletion every 60
	// ms or so, for a second and more) do not put the look off: it comes
	// settle after the first deletion.
	churning := make(chan error, 1)
	go func() {
		churning <- exec.Command("ip", "netns", "exec", fmt.Sprintf("fwtest-%d", os.Getpid()), "sh", "-c",
			`for i in $(seq 20); do nft add table inet churn; nft delete table inet churn; sleep 0.05; done`).Run()
	}()
	select {
	case <-lost:
		if err := <-churning; err != nil {
			t.Fatal(err)
		}
	case err := <-churning:
		t.Fatalf("deletions every 60 ms or so put the look off for as long as they went on (%v)", err)
	}
	time.Sleep(500 * time.Millisecond)
	for len(lost) > 0 {
		<-lost
	}

	// One rule deleted by hand.
	sh(`nft delete rule inet filter input handle $(nft -a list chain inet filter input | sed -n 's/.*operator ssh.*# handle \([0-9]*\)/\1/p')`)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("a rule deleted by hand was never said")
	}

	cancel()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the watch ended with %v, asked to end", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not end when asked")
	}
}
