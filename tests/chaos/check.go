package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// line is a report's line, as the control side and the rescue command
// print it.
type line struct {
	Module  string `json:"module"`
	ID      string `json:"id"`
	Type    string `json:"type"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail"`
}

type report struct {
	Enrolment string `json:"enrolment"`
	Seq       uint64 `json:"seq"`
	Trigger   string `json:"trigger"`
	Outcome   string `json:"outcome"`
	Lines     []line `json:"lines"`
	// Meanwhile: what the executor did on its own, on a reconnect's
	// report (a start's repairs after a boot among it) or an activity
	// report (a drift repaired while linked), each apply with the lines
	// it changed.
	Meanwhile []struct {
		Lines []line `json:"lines"`
	} `json:"meanwhile"`
	StreamSeq      uint64 `json:"report_stream_seq"`
	SupersededBy   uint64 `json:"superseded_by"`
	SupersededFrom uint64 `json:"superseded_from"`
	Owned          []struct {
		Target string `json:"target"`
		Type   string `json:"type"`
		Digest string `json:"digest"`
		Mode   string `json:"mode"`
	} `json:"owned"`
}

type nodeView struct {
	Name      string `json:"name"`
	Enrolment string `json:"enrolment"`
	State     string `json:"state"`
	Declared  uint64 `json:"declared"`
	Applied   uint64 `json:"applied"`
	Heartbeat struct {
		BrokerPinsSeq uint64 `json:"broker_pins_seq"`
	} `json:"heartbeat"`
}

func (w *world) nodesView() (map[string]nodeView, error) {
	out, code, err := w.control("nodes", "--json")
	w.lastNodes = out
	if err != nil || code != 0 {
		return nil, fmt.Errorf("mesh-control nodes: exit %d %v: %s", code, err, firstLine(out))
	}
	var vs []nodeView
	if err := json.Unmarshal([]byte(jsonArray(out)), &vs); err != nil {
		return nil, fmt.Errorf("mesh-control nodes --json: %v", err)
	}
	m := map[string]nodeView{}
	for _, v := range vs {
		m[v.Name] = v
	}
	return m, nil
}

func jsonArray(out string) string {
	i := strings.Index(out, "[")
	if i < 0 {
		return ""
	}
	var v json.RawMessage
	if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&v); err != nil {
		return ""
	}
	return string(v)
}

func (w *world) reports(n *node) []report {
	rs, _ := w.reportsOr(n)
	return rs
}

// reportsOr is reports, saying when they could not be read: a check that
// holds the machine to what reports say must not take "could not read"
// for "none".
func (w *world) reportsOr(n *node) ([]report, error) {
	out, code, err := w.control("reports", n.name, "--json", "--last", "200")
	if err != nil || code != 0 {
		return nil, fmt.Errorf("mesh-control reports %s: exit %d %v %s", n.name, code, err, firstLine(out))
	}
	var r struct {
		Reports []report `json:"reports"`
	}
	json.Unmarshal([]byte(jsonPart(out)), &r)
	return r.Reports, nil
}

func (w *world) newestReport(n *node) uint64 {
	var max uint64
	for _, r := range w.reports(n) {
		if r.StreamSeq > max {
			max = r.StreamSeq
		}
	}
	return max
}

// linkSeq is the sequence the node's own store says the link applied,
// once the node says its link is up: a quiet node is a linked one, so the
// next step's plan reaches it.
func (w *world) linkSeq(n *node) (uint64, error) {
	out, code, err := w.onNode(n, time.Minute, "", "status", "--state", n.state, "--json")
	if err != nil || code != 0 {
		return 0, fmt.Errorf("mesh-executor status: exit %d %v %s", code, err, firstLine(out))
	}
	var st struct {
		Sources map[string]struct {
			Seq uint64 `json:"seq"`
		} `json:"sources"`
		Link struct {
			Up    bool      `json:"up"`
			Since time.Time `json:"since"`
		} `json:"link"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &st); err != nil {
		return 0, err
	}
	if !st.Link.Up {
		return 0, fmt.Errorf("the node's link is down (mesh-executor status)")
	}
	// The agent tells the executor of a lost link a moment after: a link
	// up since before serve last started is one that serve's end broke,
	// and a plan sent now would find no one listening.
	// The node says when by its own clock, off by n.skew.
	if st.Link.Since.Add(-n.skew).Before(w.serveStarted) {
		return 0, fmt.Errorf("the node's link, up since %s, is from before serve started at %s: not linked again yet", st.Link.Since.Format(time.RFC3339Nano), w.serveStarted.Format(time.RFC3339Nano))
	}
	return st.Sources["link"].Seq, nil
}

// converged waits, up to bound, for the control side's view of n to be
// the node's own: the newest declared has been answered, and what the
// control side says applied is what the node's store says.
func (w *world) converged(n *node, bound time.Duration) bool {
	// A node that did not converge is said once at the full bound; until
	// it converges again it is looked at briefly, so one divergence does
	// not cost every later step the bound.
	if n.diverged {
		bound = 10 * time.Second
	}
	var why string
	start := time.Now()
	ok := w.eventually(bound, func() bool {
		vs, err := w.nodesView()
		if err != nil {
			why = err.Error()
			return false
		}
		v, found := vs[n.name]
		if !found {
			why = "not listed"
			return false
		}
		own, err := w.linkSeq(n)
		if err != nil {
			why = err.Error()
			return false
		}
		// Answered: a report names it, or the control side counts it
		// applied (a re-enrolment starts the reports afresh).
		answered := v.Declared == 0 || v.Applied >= v.Declared
		var reported uint64 // the newest sequence a report says was applied
		anyReport := false
		for _, r := range w.reports(n) {
			if r.Seq == v.Declared && r.Trigger == "declaration" {
				answered = true
			}
			// Of this enrolment only: a re-enrolled node keeps its agent's
			// key, so the old enrolment's reports, of higher sequences,
			// are listed beside the new one's.
			if r.Trigger == "declaration" && r.Outcome != "superseded" && r.Outcome != "refused" && r.Enrolment == v.Enrolment {
				reported, anyReport = max(reported, r.Seq), true
			}
		}
		if !answered {
			why = fmt.Sprintf("no report for the newest declared, seq %d (applied %d, the node's store says %d)", v.Declared, v.Applied, own)
			return false
		}
		// The status says applied before the agent's report is on the
		// broker (a paused agent resumed, say): the report of what the
		// node applied last is what the machine's changes are checked
		// against, so it must be there first.
		// (A re-enrolled node's reports start afresh — those signed by its
		// old key are not listed — while its store names what the old
		// enrolment applied: until its first report, there is none to wait
		// for.)
		if own > 0 && anyReport && reported < own {
			why = fmt.Sprintf("the node's store says %d, and no report of it yet (newest reported %d)", own, reported)
			return false
		}
		if n.enrolment != v.Enrolment {
			// Another enrolment: its sequences start again, so only the
			// applies after this count are of it (ranSuperseded).
			n.enrolment, n.histBase = v.Enrolment, newestActivity(n)
		}
		if v.Applied != own {
			why = fmt.Sprintf("the control side says applied %d, the node's store %d", v.Applied, own)
			return false
		}
		return true
	})
	if d := time.Since(start); d > 20*time.Second {
		w.logf("  (%s converged after %s)", n.name, d.Round(time.Second))
	}
	n.diverged = !ok
	if !ok {
		w.violate(n, "converges", "%s: the control side's view did not converge to the node's within %s: %s", n.name, bound, why)
	}
	return ok
}

// afterStep checks every invariant that holds now.
func (w *world) afterStep() {
	w.scanPanics()
	for _, p := range w.procs {
		w.check("no-unexpected-exit")
		if !p.running() && !p.expected {
			p.expected = true
			tail := tailOf(p.log, 1500)
			w.violate(w.nodeOfProc(p), "no-unexpected-exit", "%s exited (%v) without being asked:\n%s", p.name, p.cmd.ProcessState, tail)
			// Started again, as its init would, so the run goes on.
			if n := w.nodeOfProc(p); n != nil && p == n.exec {
				w.startExecutor(n)
			} else if n != nil && p == n.agentP {
				w.startAgent(n)
			} else if p == w.serve {
				w.startServe()
			}
		}
	}
	w.checkAcknowledged()
	for _, n := range w.nodes {
		if !w.quiet(n) {
			continue
		}
		if !w.converged(n, w.cfg.bound) {
			continue
		}
		w.checkMachine(n)
		w.checkRanNotSuperseded(n)
		w.checkKeyInForce(n)
		w.checkPinsInForce(n)
	}
}

// checkRanNotSuperseded: no report of the node's enrolment says
// superseded a declaration its executor applied — by its own history (an
// apply that changed something or failed, from the link, counted past
// the enrolment's start). A superseded declaration never ran: one that ran
// and was said superseded has its changes said nowhere.
func (w *world) checkRanNotSuperseded(n *node) {
	ran := map[uint64]bool{}
	for _, h := range history(n) {
		if h.N > n.histBase && h.Source == "link" && h.Trigger == "declaration" && h.Seq > 0 {
			ran[h.Seq] = true
		}
	}
	for _, r := range w.reports(n) {
		if r.Outcome != "superseded" || r.Trigger != "declaration" || r.Enrolment != n.enrolment {
			continue
		}
		w.check("ran-not-superseded")
		from := r.SupersededFrom
		if from == 0 {
			from = r.Seq
		}
		for s := from; s <= r.Seq && s < from+1000; s++ {
			if ran[s] {
				w.violate(n, "ran-not-superseded", "%s: a report says seqs %d–%d superseded by %d; its executor's history says seq %d was applied", n.name, from, r.Seq, r.SupersededBy, s)
				break
			}
		}
	}
}

// historyEntry is a line of an executor's history (history.jsonl).
type historyEntry struct {
	N       uint64 `json:"n"`
	Source  string `json:"source"`
	Trigger string `json:"trigger"`
	Seq     uint64 `json:"seq"`
}

// history is n's executor's history as its state holds it (a line cut
// short passed over).
func history(n *node) []historyEntry {
	b, _ := os.ReadFile(filepath.Join(n.state, "history.jsonl"))
	var out []historyEntry
	for _, line := range strings.Split(string(b), "\n") {
		var h historyEntry
		if json.Unmarshal([]byte(line), &h) == nil {
			out = append(out, h)
		}
	}
	return out
}

// newestActivity is the count of the newest line of n's history.
func newestActivity(n *node) uint64 {
	var newest uint64
	for _, h := range history(n) {
		newest = max(newest, h.N)
	}
	return newest
}

// checkKeyInForce: an enrolled node converged holds, within the bound,
// the control key the control side signs with — a rotation reaches every
// node that is not cut off, whatever happened while it was: with its
// newest declaration signed again, or, with none on its subject (never
// declared to, or emptied by its re-enrolment), sent alone while its
// heartbeats name the retired key.
func (w *world) checkKeyInForce(n *node) {
	if _, err := os.Stat(filepath.Join(n.state, "control-keys.json")); err != nil {
		return // hosted: no control key yet
	}
	w.check("key-in-force")
	var held, want string
	if w.eventually(w.cfg.bound, func() bool {
		pub, err := os.ReadFile(filepath.Join(w.ctl, "control.pub"))
		if err != nil {
			return false
		}
		want = strings.TrimSpace(string(pub))
		var ck struct {
			Key string `json:"control_key"`
		}
		b, err := os.ReadFile(filepath.Join(n.state, "control-keys.json"))
		if err != nil || json.Unmarshal(b, &ck) != nil {
			return false
		}
		held = ck.Key
		return held == want
	}) {
		return
	}
	w.violate(n, "key-in-force", "%s holds control key %q; the control side signs with %s", n.name, held, want)
}

// checkPinsInForce: an enrolled node converged holds, within the bound,
// the newest statement of the broker's certificates the control side made
// — with a declaration signed again, or sent alone while its heartbeats
// say it has not — so that a switch finds every quiet node ready.
func (w *world) checkPinsInForce(n *node) {
	if w.pinsSeq == 0 {
		return
	}
	if _, err := os.Stat(filepath.Join(n.state, "control-keys.json")); err != nil {
		return // hosted: not linked to any broker yet
	}
	if sysFull(n) {
		return // its agent cannot keep them (TestBrokerPinsAreTakenOnlyOnceKept): held once there is room
	}
	w.check("pins-in-force")
	if w.eventually(w.cfg.bound, func() bool { return w.pinsHeld(n) >= w.pinsSeq }) {
		return
	}
	w.violate(n, "pins-in-force", "%s's agent holds the broker certificates' statement %d; the control side's newest is %d", n.name, w.pinsHeld(n), w.pinsSeq)
}

// sysFull says n's system disk (the tree, the agent's state) is full now.
func sysFull(n *node) bool {
	_, err := os.Stat(n.sysFiller)
	return err == nil
}

// quiet is a node with no fault in force: its processes run, its disk
// has room, its identity stands (not revoked); and the control side's
// disk has room, or the node's reports cannot be recorded. A rekey
// waiting for room on the system disk to keep the agent's new key leaves
// the node quiet: its agent stays linked as the node it is until then.
func (w *world) quiet(n *node) bool {
	_, err := os.Stat(n.filler)
	return !w.ctlFull && n.exec.running() && !n.exec.stopped && !n.childKilled && n.agentP.running() && !n.agentP.stopped && os.IsNotExist(err) && !n.revoked
}

// checkAcknowledged: every node enrolled is listed,
// every acknowledged sequence is the newest declared or older, every
// acknowledged revocation stands.
func (w *world) checkAcknowledged() {
	vs, err := w.nodesView()
	w.check("acknowledged-kept")
	if err != nil {
		w.violate(nil, "acknowledged-kept", "%v", err)
		return
	}
	said := w.lastNodes
	var again map[string]nodeView
	for _, n := range w.nodes {
		v, ok := vs[n.name]
		w.check("acknowledged-kept")
		switch {
		case !ok:
			// Asked again at once, to tell a node lost from a listing
			// that left it out; both are violations.
			if again == nil {
				again, _ = w.nodesView()
			}
			_, listed := again[n.name]
			w.violate(n, "acknowledged-kept", "node %s, enrolled, is not listed by mesh-control nodes (listed when asked again at once: %v); it said: %.600q", n.name, listed, said)
		case v.Declared < n.acked:
			w.violate(n, "acknowledged-kept", "node %s: declared %d, but seq %d was acknowledged", n.name, v.Declared, n.acked)
		case n.revoked && v.State != "revoked":
			w.violate(n, "acknowledged-kept", "node %s: revoked, but listed as %q", n.name, v.State)
		}
	}
}

type ownedEntry struct {
	Target string `json:"target"`
	Type   string `json:"type"`
	Claims []struct {
		Source string `json:"source"`
		Module string `json:"module"`
		ID     string `json:"id"`
	} `json:"claims"`
	How string `json:"how"`
	// Pending: a change begun and not recorded (the apply failed at it,
	// its disk full, or died): the machine may hold it or not.
	Pending bool `json:"pending"`
	// Paths: what an archive wrote (the soak's), each held to the machine
	// as the archive's.
	Paths []string `json:"paths"`
}

// checkMachine compares, on a quiet node, what its store says it owns
// with the machine, and what changed on the machine since it was last
// quiet with the reports of that time.
func (w *world) checkMachine(n *node) { w.lookAtMachine(n, false) }

// lookAtMachine is checkMachine's look; again says it is the second, after
// the first raced an apply.
func (w *world) lookAtMachine(n *node, again bool) {
	owned, err := w.ownedBy(n)
	w.check("owned-on-machine")
	if err != nil {
		w.violate(n, "owned-on-machine", "%v", err)
		return
	}
	// A claim whose path is gone, and whose claim is gone a second later,
	// is a look that raced a removal (a held composition went out after
	// the node converged): the node converges again and is looked at once
	// more, as for a write (below).
	if !again {
		var missing []string
		for _, o := range owned {
			if p, ok := strings.CutPrefix(o.Target, "path:"); ok && strings.HasPrefix(p, n.tree+"/") && !o.Pending {
				if _, err := os.Lstat(p); err != nil {
					missing = append(missing, p)
				}
			}
		}
		if len(missing) > 0 {
			time.Sleep(time.Second)
			later := w.claimedPaths(n)
			raced := later != nil
			for _, p := range missing {
				raced = raced && !later[p]
			}
			if raced {
				w.check("looked-again")
				w.logf("  (the look at %s raced a removal: %d path(s) no longer claimed a second later; looking again once it converges)", n.name, len(missing))
				if w.converged(n, w.cfg.bound) {
					w.lookAtMachine(n, true)
				}
				return
			}
		}
	}
	claimed := map[string]bool{}
	for _, o := range owned {
		for _, p := range o.Paths {
			claimed[p] = true
			if o.Pending {
				continue
			}
			w.check("owned-on-machine")
			if _, err := os.Lstat(p); err != nil {
				w.violate(n, "owned-on-machine", "%s's store owns %s, written by the archive %s, which the machine does not hold: %v", n.name, p, o.Target, err)
			}
		}
		p, ok := strings.CutPrefix(o.Target, "path:")
		if !ok || !strings.HasPrefix(p, n.tree+"/") {
			continue
		}
		claimed[p] = true
		if o.Pending {
			continue // claimed, whatever the machine holds of it
		}
		w.check("owned-on-machine")
		fi, err := os.Lstat(p)
		if err != nil {
			w.violate(n, "owned-on-machine", "%s's store owns %s (%s), which the machine does not hold: %v", n.name, p, o.Type, err)
			continue
		}
		switch o.Type {
		case "directory":
			if !fi.IsDir() {
				w.violate(n, "owned-on-machine", "%s's store owns the directory %s; the machine holds a %s", n.name, p, fi.Mode().Type())
			}
		case "file":
			b, err := os.ReadFile(p)
			if !fi.Mode().IsRegular() || err != nil {
				w.violate(n, "owned-on-machine", "%s's store owns the file %s; the machine holds a %s (%v)", n.name, p, fi.Mode().Type(), err)
				continue
			}
			if msg := fileMatches(b, fi.Mode().Perm(), o); msg != "" {
				w.violate(n, "owned-on-machine", "%s's store owns the file %s: %s", n.name, p, msg)
			}
		}
	}
	// The reverse: each path the mesh may declare that the machine holds
	// is claimed by the store.
	// The newest report is marked before the machine is looked at: a
	// report that lands in between is read again at the next check, where
	// the change it says will be, never skipped while its change is not
	// yet in this snapshot.
	mark := w.newestReport(n)
	after, err := snapshotNode(n)
	if err != nil {
		w.check("host-firewall-kept")
		w.violate(n, "host-firewall-kept", "%v", err)
	}
	var unclaimed []string
	for p := range after {
		if declarable(n, p) {
			w.check("machine-in-store")
			if !claimed[p] {
				unclaimed = append(unclaimed, p)
			}
		}
	}
	if len(unclaimed) > 0 {
		// Looked at again a moment later, to tell a leftover from a look
		// that raced an apply: a node converged may still be given a
		// composition that was held (its assignments go out once it
		// reports its overlay applied, after the look began). When every
		// path is claimed a moment later, the run waits for the node to
		// converge again and looks once more; a leftover, or a second look
		// that races again, is a violation.
		time.Sleep(time.Second)
		later := w.claimedPaths(n)
		raced := true
		for _, p := range unclaimed {
			raced = raced && later[p]
		}
		if raced && !again {
			w.check("looked-again")
			w.logf("  (the look at %s raced an apply: %d path(s) claimed a second later; looking again once it converges)", n.name, len(unclaimed))
			if w.converged(n, w.cfg.bound) {
				w.lookAtMachine(n, true)
			}
			return
		}
		sort.Strings(unclaimed)
		for _, p := range unclaimed {
			how := "still unclaimed a second later"
			if later[p] {
				how = "claimed a second later: the look raced an apply"
			}
			w.violate(n, "machine-in-store", "%s holds %s, which no store claims (a leftover, or a write not recorded; %s)", n.name, p, how)
		}
	}
	// What the host made (the shared file, the firewall) against the
	// store's regions and openings, looked at again once, as above, when
	// the look may have raced an apply.
	if problems := w.hostMadeProblems(n, owned); len(problems) > 0 {
		if !again {
			w.check("looked-again")
			w.logf("  (the look at %s found what the host made not as its store says (%s); looking again once it converges)", n.name, problems[0].msg)
			// A rule the host's firewall took while the executor was
			// stopped comes back once it runs: its watch waits for the
			// ruleset to settle (2 s) before it looks.
			w.eventually(10*time.Second, func() bool {
				owned, err := w.ownedBy(n)
				return err == nil && len(w.hostMadeProblems(n, owned)) == 0
			})
			if w.converged(n, w.cfg.bound) {
				w.lookAtMachine(n, true)
			}
			return
		}
		for _, p := range problems {
			w.violate(n, p.inv, "%s: %s", n.name, p.msg)
		}
	}
	w.checkReportDigests(n, after)
	w.checkChanges(n, after)
	if n.keepBefore {
		n.keepBefore = false
		return
	}
	n.before = after
	n.lastReport = mark
	n.rescue = nil
}

// claimedPaths is the set of paths n's store claims now (nil when it
// cannot be read).
func (w *world) claimedPaths(n *node) map[string]bool {
	owned, err := w.ownedBy(n)
	if err != nil {
		return nil
	}
	m := map[string]bool{}
	for _, o := range owned {
		if p, ok := strings.CutPrefix(o.Target, "path:"); ok {
			m[p] = true
		}
	}
	return m
}

// ownedBy is what n's store claims, as mesh-executor owned --json says.
func (w *world) ownedBy(n *node) ([]ownedEntry, error) {
	out, code, err := w.onNode(n, time.Minute, "", "owned", "--state", n.state, "--json")
	if err != nil || code != 0 {
		return nil, fmt.Errorf("mesh-executor owned: exit %d %v %s", code, err, firstLine(out))
	}
	var owned []ownedEntry
	if err := json.Unmarshal([]byte(jsonArray(out)), &owned); err != nil {
		return nil, fmt.Errorf("mesh-executor owned --json: %w: %s", err, firstLine(out))
	}
	return owned, nil
}

// fileMatches checks a file against its claim: its content names one of
// the claiming resources, and its mode is the one that content says.
func fileMatches(b []byte, perm os.FileMode, o ownedEntry) string {
	head, _, _ := bytes.Cut(b, []byte("\n"))
	var mod, id, mode string
	var v int
	if _, err := fmt.Sscanf(string(head), "chaos %s v%d mode=%s", &id, &v, &mode); err != nil {
		return fmt.Sprintf("content %.60q is none the mesh declared", b)
	}
	mod, id, _ = strings.Cut(id, ".")
	named := false
	for _, c := range o.Claims {
		if c.Module == mod && c.ID == id {
			named = true
		}
	}
	if !named {
		return fmt.Sprintf("content is %s.%s's, claimed by %+v", mod, id, o.Claims)
	}
	if got := fmt.Sprintf("%04o", perm); got != mode {
		return fmt.Sprintf("mode %s, declared with its content as %s", got, mode)
	}
	return ""
}

// declarable is a path inside a module's directory: the only places the
// run declares anything.
func declarable(n *node, p string) bool {
	for _, side := range []string{"L", "R"} {
		rel, err := filepath.Rel(filepath.Join(n.tree, side), p)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		mod := strings.Split(rel, string(filepath.Separator))[0]
		return contains(modNames, mod) || mod == "r1" || mod == "r2" || mod == soakArchive
	}
	return false
}

// checkReportDigests: the newest report's copy of the store names, for
// each link file, the digest and mode the machine holds.
func (w *world) checkReportDigests(n *node, after map[string]entry) {
	rs := w.reports(n)
	sort.Slice(rs, func(i, j int) bool { return rs[i].StreamSeq < rs[j].StreamSeq })
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].Owned == nil || (n.enrolment != "" && rs[i].Enrolment != n.enrolment) {
			continue
		}
		for _, o := range rs[i].Owned {
			p, ok := strings.CutPrefix(o.Target, "path:")
			if !ok || o.Type != "file" || !strings.HasPrefix(p, filepath.Join(n.tree, "L")+"/") {
				continue
			}
			w.check("report-store-copy")
			e, ok := after[p]
			switch {
			case !ok:
				w.violate(n, "report-store-copy", "%s's newest report (seq %d) says the node owns %s; the machine does not hold it", n.name, rs[i].Seq, p)
			case hex.EncodeToString(e.digest[:]) != o.Digest || fmt.Sprintf("%04o", e.mode.Perm()) != o.Mode:
				w.violate(n, "report-store-copy", "%s's newest report (seq %d) says %s is %s %s; the machine holds %x %04o", n.name, rs[i].Seq, p, o.Digest, o.Mode, e.digest, e.mode.Perm())
			}
		}
		return
	}
}

// activityReported bounds how long after the machine changed an agent
// reports what its executor did on its own: it asks the executor's status
// every few seconds (agent statusEvery), and reports a new activity then.
const activityReported = 15 * time.Second

// checkChanges: each path that changed since the node was last quiet is
// one the mesh declares, and a report line (or a rescue's) says it.
func (w *world) checkChanges(n *node, after map[string]entry) {
	if n.before == nil {
		// The soak's: thousands of reports since the node was last looked
		// at, more than a node's stream keeps; its store and machine are
		// held to each other, not its changes to their reports.
		return
	}
	read := func() ([]line, error) {
		rs, err := w.reportsOr(n)
		if err != nil {
			return nil, err
		}
		var lines []line
		for _, r := range rs {
			if r.StreamSeq > n.lastReport {
				lines = append(lines, r.Lines...)
				for _, a := range r.Meanwhile {
					lines = append(lines, a.Lines...)
				}
			}
		}
		return append(lines, n.rescue...), nil
	}
	lines, err := read()
	if err != nil {
		// Not read: the changes stay to be checked against the next
		// look's reports (n.before is kept), never against none.
		w.logf("  (%s: the reports could not be read (%v); its changes are checked at its next quiet step)", n.name, err)
		n.keepBefore = true
		return
	}
	changed := changes(n.before, after)
	saidAll := func() bool {
		for p, what := range changed {
			if declarable(n, p) && unexplained(n, p, what, lines) != "" {
				return false
			}
		}
		return true
	}
	if !saidAll() {
		// What the executor does on its own (a reconcile the firewall's
		// reload started, a rescue file's resources applied at last) is
		// reported by the agent when it next asks the executor its status,
		// seconds after the machine changed: read again for as long as
		// that takes, never past it.
		w.eventually(activityReported, func() bool {
			if l, err := read(); err == nil {
				lines = l
			}
			return saidAll()
		})
	}
	for p, what := range changed {
		w.check("nothing-outside")
		w.check("report-says-change")
		if msg := unexplained(n, p, what, lines); msg != "" {
			inv := "report-says-change"
			if !declarable(n, p) && !meshMade(n, p) {
				inv = "nothing-outside"
			}
			w.violate(n, inv, "%s: %s", n.name, msg)
		}
	}
}

// changes is each path created, removed or changed (type, mode, content)
// between two snapshots.
func changes(before, after map[string]entry) map[string]string {
	changed := map[string]string{}
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			changed[p] = "removed"
		case a != b:
			changed[p] = "changed"
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			changed[p] = "created"
		}
	}
	return changed
}

// unexplained says why the change what at p is not one the mesh made and
// said: outside what it declares, or with no line of a report saying it
// changed that resource; "" when it is.
func unexplained(n *node, p, what string, lines []line) string {
	if !declarable(n, p) && !meshMade(n, p) {
		return fmt.Sprintf("%s was %s, and nothing declares it", p, what)
	}
	for _, l := range lines {
		switch l.Outcome {
		case "unchanged", "held", "kept", "forgotten":
			continue
		}
		if idPath(n, l.Module, l.ID) == p || hostMadeAt(n, p, l.Module, l.ID) || unpackedBy(n, p, l.Module, l.ID) {
			return ""
		}
	}
	return fmt.Sprintf("%s was %s since the node was last quiet, and no report line says so", p, what)
}

func tailOf(path string, max int) string {
	b, _ := os.ReadFile(path)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// figures is what a run did, printed at its end.
func (w *world) figures(steps []step) string {
	var b strings.Builder
	kinds := map[string]int{}
	for _, s := range steps {
		kinds[s.Kind]++
	}
	fmt.Fprintf(&b, "steps: %d (%s)\n", len(steps), sortedCounts(kinds))
	total := 0
	for _, c := range w.faults {
		total += c
	}
	fmt.Fprintf(&b, "faults injected: %d (%s)\n", total, sortedCounts(w.faults))
	total = 0
	for _, c := range w.checks {
		total += c
	}
	fmt.Fprintf(&b, "invariant checks: %d (%s)\n", total, sortedCounts(w.checks))
	if len(w.known) > 0 {
		fmt.Fprintf(&b, "known faults seen: %s\n", sortedCounts(w.known))
	}
	fmt.Fprintf(&b, "violations: %d\n", len(w.violations))
	return b.String()
}

func sortedCounts(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
