package firewall

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The mesh's rules live in chains the host owns, and the host's firewall
// takes them away whenever it loads its own rules again: nftables.service
// restarted or reloaded (its file begins with "flush ruleset"), a person's
// "nft -f /etc/nftables.conf", a package upgrade that reloads it. Every
// opening is then closed until the executor's next reconcile — ten minutes
// on the drift timer — and an overlay whose port it opened drops off the
// mesh for as long. Watch tells the executor at once.
//
// It listens to the kernel's own notices of ruleset changes (the
// NFNLGRP_NFTABLES netlink group, what "nft monitor" reads), and reads
// only each message's type: a table, a chain or a rule deleted, or a chain
// made — the host's chains back after a flush that came a while before (a
// stop and a later start, a reload of separate commands slower than the
// settle): the look after the flush found no chain to miss a rule in, and
// the openings belong in the new one. Read with
// netlink directly rather than google/nftables' Monitor, which decodes
// every rule of every change in a goroutine of its own (where a decoding
// panic could not be recovered, and a host whose rules churn — a
// kube-proxy's — would cost the executor a decode of each), and whose
// filter by action (v0.3.0: "monitorFlags&1<<msgType", read as
// "(monitorFlags&1)<<msgType") passes nothing for a monitor of deletions
// alone; docs/dependencies.md says so for its maintainers.

// Watch calls lost each time the ruleset has lost a table, a chain or a
// rule, or gained a chain, settle after the first such notice of a burst
// (a reload is a burst of
// deletions and additions, one transaction or a few: one call for it,
// after it; a host whose rules churn without pause — a kube-proxy's — is
// looked at once every settle, never put off for good), until ctx ends
// (nil) or the kernel's notices cannot be read (the error). A notice the
// socket's buffer overran may have been a deletion: that counts as one.
// netns, when not 0, is the network namespace's file descriptor (tests).
func Watch(ctx context.Context, settle time.Duration, lost func(), netns int) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return fmt.Errorf("nftables: netlink: %w", err)
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		c.Close()
		return fmt.Errorf("nftables: the ruleset's change notices: %w", err)
	}
	type seen struct {
		deleted bool
		err     error
	}
	notices := make(chan seen, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer c.Close()
		for {
			msgs, err := c.Receive()
			var s seen
			switch {
			case errors.Is(err, unix.ENOBUFS):
				s.deleted = true // overrun: what was lost may have been one
			case err != nil:
				s.err = err
			default:
				for _, m := range msgs {
					s.deleted = s.deleted || mayHaveLost(m.Header.Type)
				}
			}
			switch {
			case s.err != nil:
				select {
				case notices <- s:
				case <-done:
				}
				return
			case s.deleted:
				select {
				case notices <- s:
				default: // one waiting says it already
				}
			}
		}
	}()
	// The receiving goroutine ends once its socket is closed: closed here
	// when ctx ends, by it on an error.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var due <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-notices:
			if s.err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("nftables: reading the ruleset's change notices: %w", s.err)
			}
			if due == nil {
				due = time.After(settle)
			}
		case <-due:
			due = nil
			lost()
		}
	}
}

// mayHaveLost says whether a netlink message of type t is nftables saying
// it deleted a table, a chain or a rule, or made a chain (see above).
func mayHaveLost(t netlink.HeaderType) bool {
	if t>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return false
	}
	switch t & 0xff {
	case unix.NFT_MSG_DELTABLE, unix.NFT_MSG_DELCHAIN, unix.NFT_MSG_DELRULE, unix.NFT_MSG_NEWCHAIN:
		return true
	}
	return false
}
