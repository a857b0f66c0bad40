package enrol

import (
	"fmt"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Recovery says what a store copy came to.
type Recovery struct {
	// Taken: entries put into the store, marked recovered.
	Taken int
	// Skipped: entries left out (a shape whose removal nothing could
	// prove safe, a target in the protected set, not a clean path).
	Skipped []string
	// Intact: the store held entries already, so the copy was not used:
	// a node that disagrees with the copy wins.
	Intact bool
}

// Recover takes a store copy handed back at enrolment into an empty
// store: the control side's record of what the node last reported it
// owns, signed under the pinned key for this very enrolment. Only files
// and directories are taken, outside the protected set, each marked
// recovered, so that the next link apply removes one it no longer
// declares only if it is still exactly what the host wrote. A store that
// holds anything is left as it is.
func Recover(dir string, id *identity.Identity, envelope []byte, wait time.Duration) (*Recovery, error) {
	payload, err := wire.Open(id.ControlKey, wire.PurposeStoreCopy, envelope)
	if err != nil {
		return nil, fmt.Errorf("the store copy: %w", err)
	}
	c, err := wire.ParseStoreCopy(payload)
	if err != nil {
		return nil, err
	}
	if c.Node != id.Node || c.Enrolment != id.Enrolment {
		return nil, fmt.Errorf("the store copy is for node %q enrolment %q; this is node %q enrolment %q", c.Node, c.Enrolment, id.Node, id.Enrolment)
	}
	st, err := store.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := st.Lock(wait); err != nil {
		return nil, err
	}
	defer st.Unlock()
	if len(st.Entries()) > 0 {
		return &Recovery{Intact: true}, nil
	}
	rec := &Recovery{}
	for _, e := range c.Entries {
		p, isPath := strings.CutPrefix(e.Target, "path:")
		switch {
		case e.Type != shapes.TypeFile && e.Type != shapes.TypeDirectory:
			rec.Skipped = append(rec.Skipped, fmt.Sprintf("%s (%s: nothing proves it is still what the host made)", e.Target, e.Type))
			continue
		case !isPath || !strings.HasPrefix(p, "/") || shapes.ProtectedPath(p) != "" || e.Module == "" || e.ID == "":
			rec.Skipped = append(rec.Skipped, fmt.Sprintf("%s (not a path the host may own)", e.Target))
			continue
		}
		if err := st.Put(&store.Entry{
			Target: e.Target, Type: e.Type, Claims: []store.Claim{{Source: store.Link, Module: e.Module, ID: e.ID}},
			Created: true, Recovered: true, Digest: e.Digest, Mode: uint32(e.Mode), UID: e.UID, GID: e.GID,
		}); err != nil {
			return nil, err
		}
		rec.Taken++
	}
	if err := st.Sync(); err != nil {
		return nil, err
	}
	return rec, st.Commit()
}

// Owned lists what the host made for the link, oldest first: what a
// report carries upward so the control side can hand it back after a lost
// store.
func Owned(st *store.Store) []wire.OwnedEntry {
	out := []wire.OwnedEntry{} // empty, not absent: a node that owns nothing says so
	for _, e := range st.Entries() {
		if !e.Created || e.Held || e.Stub || e.Pending != nil {
			continue
		}
		for _, c := range e.Claims {
			if c.Source == store.Link {
				out = append(out, wire.OwnedEntry{Target: e.Target, Type: e.Type, Module: c.Module, ID: c.ID,
					Digest: e.Digest, Mode: wire.Mode(e.Mode), UID: e.UID, GID: e.GID})
				break
			}
		}
	}
	return out
}
