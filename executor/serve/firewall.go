package serve

import (
	"context"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
)

// The host's firewall loaded again (nftables.service restarted, a person's
// "nft -f") takes the mesh's rules from the chains it rebuilds; left to the
// drift timer, every opening — the overlay's port among them — would stay
// closed for up to its interval. The daemon watches the ruleset
// (firewall.Watch) and, a moment after a change that deleted something or
// made a chain (the host's chains back after a flush), looks whether an opening its store records has lost its rule;
// only then does it reconcile, with the trigger "firewall", putting back
// what the store records even where a step before it fails
// (engine.Options.Restore), as its start does after a boot. A change that
// took nothing of the mesh's — the host's own rules edited, a container
// runtime's churn — costs one look at the firewall, and no apply.

// firewallSettle is how long after the first notice of a burst the
// daemon looks: a reload is one burst of milliseconds, a script that loads
// its rules one nft call at a time a few of them; rules that churn are
// looked at once every firewallSettle.
const firewallSettle = 2 * time.Second

// firewallRetry is how long the daemon waits to watch again when the
// kernel's notices could not be read (no nf_tables, a socket error).
const firewallRetry = time.Minute

// watchFirewall runs until ctx ends.
func (s *Server) watchFirewall(ctx context.Context) {
	said := false
	for {
		err := firewall.Watch(ctx, firewallSettle, func() {
			s.guard("the firewall's reconcile", func() { s.afterFirewallLoss(ctx) })
		}, 0)
		if ctx.Err() != nil {
			return
		}
		if !said {
			s.log.Warn("the firewall cannot be watched; a rule the host's firewall takes is put back by the drift timer only", "err", err, "retry", firewallRetry)
			said = true
		} else {
			s.log.Debug("the firewall cannot be watched", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(firewallRetry):
		}
	}
}

// afterFirewallLoss reconciles when an opening the store records has lost
// its rule; under the apply lock, so it neither races an apply nor looks
// in the middle of one.
func (s *Server) afterFirewallLoss(ctx context.Context) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	st, err := s.openStore()
	if err != nil {
		s.log.Warn("the firewall changed; the store could not be read", "err", err)
		return
	}
	if err := s.lockStore(st); err != nil {
		s.log.Warn("the firewall changed; the store could not be read", "err", err)
		return
	}
	lost, err := engine.OpeningsLost(ctx, st)
	st.Unlock()
	switch {
	case err != nil:
		s.log.Warn("the firewall changed; its openings could not be looked at", "err", err)
	case lost:
		s.log.Info("the firewall lost a rule of the mesh's (the host's firewall loaded again?); reconciling")
		s.reconcile(ctx, triggerFirewall, nil, false)
	}
}
