package main

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
)

// A step is one thing an operator or the machine does. The whole list is
// drawn from the seed before anything runs, against a model of which
// faults are in force, so that a seed names one run exactly: nothing a
// step observes changes which steps follow.
type step struct {
	N    int    `json:"n"`
	Kind string `json:"kind"`
	Node string `json:"node,omitempty"`
	// Proc is the process a fault or a recovery acts on: serve, or
	// NODE/executor, NODE/agent.
	Proc string `json:"proc,omitempty"`
	// Module is what assign and unassign name.
	Module string `json:"module,omitempty"`
	// Doc is what declare, assign, plan and rescue send: modules, each a
	// directory of its own under the node's tree.
	Doc []module `json:"doc,omitempty"`
	// Arg is a step's number: the overlay's keepalive, a fault's length.
	Arg int `json:"arg,omitempty"`
	// Known names the fault, listed in knownFaults, that this step
	// provokes on purpose: its violations are counted as known.
	Known string `json:"known,omitempty"`
	// Paused: a plan sent to a node whose agent is stopped — given up
	// after a moment, as an operator would, and not expected answered.
	Paused bool `json:"paused,omitempty"`
}

// A module is a directory under the node's tree (L/NAME for the link,
// R/NAME for a rescue file) and what is declared in it. Each file's
// content names its module, id and mode, so that what a store claims can
// be checked against the machine without a model of which version won.
type module struct {
	Name  string    `json:"name"`
	Files []fileRes `json:"files"`
	// Subdir, when set, is a directory inside the module's, declared
	// before the files that live in it.
	Subdir string `json:"subdir,omitempty"`
	// Region, Opening and Keys change what the host made rather than what
	// the module's directory holds: a block of lines in the node's shared
	// file, a port opened through the firewall of its network namespace,
	// keys' values in its shared environment file. Drawn by drawExtras.
	Region  *regionRes  `json:"region,omitempty"`
	Opening *openingRes `json:"opening,omitempty"`
	// Keys, when set, is the version of the module's keys (id "keys") in
	// the node's shared environment file: mod_NAME, and for module c
	// also host_c, a key the host wrote with a value of its own.
	Keys *uint32 `json:"keys,omitempty"`
	// Archive, when set, is which of the run's archives (chaosArchives)
	// the module unpacks into its directory (id "arch"): over the link
	// from the control side's object store, in a rescue file from a
	// file:// URL.
	Archive *int `json:"archive,omitempty"`
}

// regionRes is the module's block in the node's shared file (id "reg"):
// its content names the module, the id and the version, and Lines lines
// follow.
type regionRes struct {
	Version uint32 `json:"version"`
	Lines   int    `json:"lines"`
}

// openingRes is the module's opening (id "open") of its own port
// (portOf), on a path, for a protocol, from anywhere or from a prefix.
type openingRes struct {
	Path     string `json:"path"`
	Protocol string `json:"protocol"`
	From     string `json:"from,omitempty"`
}

type fileRes struct {
	Name    string `json:"name"` // relative to the module's directory: "x" or "sub/x"
	Mode    string `json:"mode"`
	Version uint32 `json:"version"`
	Pad     int    `json:"pad,omitempty"`
}

func (s step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%3d %s", s.N, s.Kind)
	for _, x := range []string{s.Node, s.Proc, s.Module} {
		if x != "" {
			b.WriteString(" " + x)
		}
	}
	if s.Arg != 0 {
		fmt.Fprintf(&b, " %d", s.Arg)
	}
	if len(s.Doc) > 0 {
		var ms []string
		for _, m := range s.Doc {
			extra := ""
			if m.Region != nil {
				extra += "+region"
			}
			if m.Opening != nil {
				extra += "+opening"
			}
			if m.Keys != nil {
				extra += "+keys"
			}
			if m.Archive != nil {
				extra += fmt.Sprintf("+archive%d", *m.Archive)
			}
			ms = append(ms, fmt.Sprintf("%s(%d%s)", m.Name, len(m.Files), extra))
		}
		b.WriteString(" [" + strings.Join(ms, " ") + "]")
	}
	if s.Known != "" {
		b.WriteString(" (known: " + s.Known + ")")
	}
	if s.Paused {
		b.WriteString(" (to a paused agent)")
	}
	return b.String()
}

// knownFaults are the faults the system is known to have now, each being
// fixed: a step that meets one is labelled with its name (step.Known), its
// violations are counted and printed but do not fail a run, and -strict
// fails them, to see the day one is fixed. A plan sent to a paused agent,
// a second executor on a live socket, writes on the control side's full
// disk and a revoked agent's retries were listed here until they were
// fixed, and a run now fails on them like on anything else.
var knownFaults = map[string]string{
	"control-reopen-timeout": "a command in the seconds after the control side's disk has room again times out while serve opens the broker's store anew (JetStream shut down and enabled again); serve now tells a command that failed then why (\"opened anew … run it again\"), and a timeout said so is no violation — one said bare is this fault",
}

// The kinds of step, with the weights they are drawn by.
var weights = []struct {
	kind string
	w    int
}{
	{"declare", 10}, {"assign", 9}, {"unassign", 4}, {"publish", 3}, {"plan", 4},
	{"overlay", 2}, {"revoke", 1}, {"reenrol", 2}, {"token", 2}, {"rescue", 6},
	{"kill", 4}, {"stop", 3}, {"restart-serve", 2}, {"kill-serve", 1}, {"second", 3},
	{"disk-full", 2}, {"plan-paused", 1}, {"second-socket", 1},
}

// ctlWeights are the faults of the control side's disk, drawn beside
// weights' kinds (with these weights out of the sum of both) from a
// stream of the seed's own: a seed draws from weights what it drew before
// these kinds were added, with theirs put in between, so that a seed kept
// for what it found still provokes it.
var ctlWeights = []struct {
	kind string
	w    int
}{
	{"power-cut", 1}, {"ctl-disk-full", 1},
}

// clockEvery: one step in about this many is a node's clock put hours
// off, drawn from a stream of the seed's own, as ctlWeights' kinds are: a
// seed draws from weights and ctlWeights what it drew before the clock
// was drawn, with the clock's steps put in between.
const clockEvery = 40

// pauseEvery: one step in about this many pauses serve (SIGSTOP, then
// SIGCONT 2 to 10 seconds later: a control machine that stalls, a virtual
// machine moved), drawn from a fourth stream of the seed's own.
const pauseEvery = 50

// rotateEvery: one step in about this many rotates the control key (key
// rotate), drawn from a fifth stream of the seed's own, so that a seed
// draws what it drew before rotations were drawn, with them put in
// between: whatever the faults in force, every node ends holding the key
// the control side signs with.
const rotateEvery = 30

// rekeyEvery: one step in about this many renews a node's keys
// (mesh-executor rekey on a node that runs and is not revoked), drawn,
// with the node, from a sixth stream of the seed's own.
const rekeyEvery = 40

// certEvery: one step in about this many rotates the broker's certificate
// (cert rotate: the announcement, with its switch drawn 3 to 8 steps
// later), drawn from a seventh stream of the seed's own, first in a step's
// draws, so that a seed draws what it drew before certificates were drawn,
// with them put in between: whatever the faults in force, every node ends
// holding the newest statement of the broker's certificates, and links to
// the certificate switched to. A variable for TestStepsDeriveFromTheSeedAlone.
var certEvery = 40

// nodeCutEvery: one step in about this many cuts a node's power (its
// disks copied as they are at an instant, every process of the node
// killed, the machine started again on the copies), drawn with the node
// from a ninth stream of the seed's own, before a step's other draws,
// which go on as without it. Only on a node with no fault of its own in
// force, and with loop devices. A variable for
// TestStepsDeriveFromTheSeedAlone.
var nodeCutEvery = 40

// nodeCutAt, when not negative, is every node-power-cut's delay in
// milliseconds instead of the one drawn: the seed's steps are its own, but
// where a delay falls in an apply depends on the machine's speed, and one
// that another machine met is met here by naming it.
var nodeCutAt = -1

// sysDiskEvery: one step in about this many fills a node's system disk
// (the tree the mesh writes in, the agent's state) to the last byte,
// freed 1 to 4 steps later, drawn with the node from a tenth stream of
// the seed's own, before a step's other draws, which go on as without
// it: the node's other faults are drawn as before, beside it. Only with
// loop devices (without one the system disk is a directory of the run's).
// A variable for TestStepsDeriveFromTheSeedAlone.
var sysDiskEvery = 30

// fwReloadEvery: one step in about this many loads a node's firewall
// again, as its own service does when restarted or a person runs
// "nft -f" (the ruleset flushed, the host's rules loaded, the mesh's
// gone with them), drawn with the node from an eleventh stream of the
// seed's own, before a step's other draws, which go on as without it.
// A variable for TestStepsDeriveFromTheSeedAlone.
var fwReloadEvery = 30

// restartOnFull: serve is restarted, killed or its power cut while the
// control side's disk is full, where a draw passed it over before those
// were drawn. A variable for TestControlDiskFaultsDrawnAsTheyCanBe.
var restartOnFull = true

// simNode is the generator's model of one node: what is in force, never
// what the system did.
type simNode struct {
	name          string
	execDown      bool
	execStopped   bool
	agentDown     bool
	agentStopped  bool
	diskFull      bool
	revoked       bool
	clockOff      bool
	sysFull       bool
	assigned      []string
	modules       map[string]module // the last version of each module assigned
	pendingEvents int
}

func (n *simNode) healthy() bool {
	return !n.execDown && !n.execStopped && !n.agentDown && !n.agentStopped && !n.diskFull
}

// plan draws the seed's steps. A fault is undone by a step drawn with it
// and run a few steps later; all faults are undone by the last step.
// loop says whether the control side is on a filesystem image that can
// be copied (a loop device): without one, no power cut is drawn.
func planSteps(seed uint64, count, nodes int, loop bool) []step {
	r := rand.New(rand.NewPCG(seed, 0x6368616f73))      // "chaos"
	rc := rand.New(rand.NewPCG(seed, 0x63746c6469736b)) // "ctldisk": the control side's faults
	rk := rand.New(rand.NewPCG(seed, 0x636c6f636b))     // "clock": a node's clock off
	rp := rand.New(rand.NewPCG(seed, 0x7061757365))     // "pause": serve paused
	rr := rand.New(rand.NewPCG(seed, 0x726f74617465))   // "rotate": the control key rotated
	rq := rand.New(rand.NewPCG(seed, 0x72656b6579))     // "rekey": a node's keys renewed
	rt := rand.New(rand.NewPCG(seed, 0x63657274))       // "cert": the broker's certificate rotated
	rn := rand.New(rand.NewPCG(seed, 0x6e6f6465637574)) // "nodecut": a node's power cut
	rs := rand.New(rand.NewPCG(seed, 0x737973646973))   // "sysdis": a node's system disk full
	rf := rand.New(rand.NewPCG(seed, 0x66776c6f6164))   // "fwload": a node's firewall loaded again
	// certDue: an announcement's switch is drawn and not run yet.
	certDue := false
	// ctlFull: the control side's disk is full. What an operator's
	// command would write is refused then, so the model counts no write
	// made while it is (no assignment, revocation, overlay).
	ctlFull := false
	var ns []*simNode
	for i := 1; i <= nodes; i++ {
		ns = append(ns, &simNode{name: fmt.Sprintf("n%d", i), modules: map[string]module{}})
	}
	overlay := false
	var steps []step
	// pending recoveries: at step index, the step to run.
	pending := map[int][]step{}
	total, ctlTotal := 0, 0
	for _, x := range weights {
		total += x.w
	}
	for _, x := range ctlWeights {
		ctlTotal += x.w
	}
	pick := func() *simNode { return ns[r.IntN(len(ns))] }
	healthyNode := func() *simNode {
		var hs []*simNode
		for _, n := range ns {
			if n.healthy() && !n.revoked {
				hs = append(hs, n)
			}
		}
		if len(hs) == 0 {
			return nil
		}
		return hs[r.IntN(len(hs))]
	}
	addStep := func(s step) {
		s.N = len(steps) + 1
		steps = append(steps, s)
	}
	// shiftPending puts what is pending by steps later: a certificate's
	// steps are put in between the others, each of which then comes as
	// many of the others' steps after its fault as before they were drawn.
	shiftPending := func(by int) {
		if by == 0 {
			return
		}
		shifted := map[int][]step{}
		for at, ss := range pending {
			shifted[at+by] = ss
		}
		pending = shifted
	}
	later := func(s step) {
		at := len(steps) + 1 + r.IntN(4)
		pending[at] = append(pending[at], s)
	}
	undo := func(n *simNode, s step) {
		switch s.Kind {
		case "ctl-disk-free":
			ctlFull = false
			return
		case "cert-switch":
			certDue = false
			return
		case "sys-disk-free":
			n.sysFull = false
			return
		}
		switch s.Kind {
		case "cont":
			if strings.HasSuffix(s.Proc, "executor") {
				n.execStopped = false
			} else {
				n.agentStopped = false
			}
		case "start":
			if strings.HasSuffix(s.Proc, "executor") {
				n.execDown = false
			} else {
				n.agentDown = false
			}
		case "disk-free":
			n.diskFull = false
		case "clock-right":
			n.clockOff = false
		}
		n.pendingEvents--
	}
	nodeOf := func(name string) *simNode {
		for _, n := range ns {
			if n.name == name {
				return n
			}
		}
		return nil
	}
	for len(steps) < count {
		var due []int
		for at := range pending {
			if at <= len(steps) {
				due = append(due, at)
			}
		}
		sort.Ints(due)
		switches := 0
		for _, at := range due {
			for _, s := range pending[at] {
				undo(nodeOf(s.Node), s)
				addStep(s)
				if s.Kind == "cert-switch" || s.Kind == "sys-disk-free" {
					switches++ // put between the others
				}
			}
			delete(pending, at)
		}
		shiftPending(switches)
		if len(steps) >= count {
			break
		}
		if rt.IntN(certEvery) == 0 && !ctlFull && !certDue {
			// Put before this round's other draws, which go on as
			// without it.
			addStep(step{Kind: "cert-rotate"})
			shiftPending(1)
			at := len(steps) + 3 + rt.IntN(6)
			pending[at] = append(pending[at], step{Kind: "cert-switch"})
			certDue = true
			if len(steps) >= count {
				break
			}
		}
		if rn.IntN(nodeCutEvery) == 0 {
			// Put before this round's other draws, which go on as
			// without it; its node drawn whether or not it can be cut.
			// A declaration to the node is cut short at an instant after
			// it was acknowledged (received, applied, recorded, reported,
			// or none yet): its modules and their extras drawn here too,
			// so that drawExtras gives the other steps' modules what it
			// gave them without the cut.
			n := ns[rn.IntN(len(ns))]
			doc := genDoc(rn, 1+rn.IntN(3))
			for j := range doc {
				drawModuleExtras(rn, &doc[j])
			}
			after := rn.IntN(2000)
			if loop && n.pendingEvents == 0 {
				addStep(step{Kind: "node-power-cut", Node: n.name, Doc: doc, Arg: after})
				shiftPending(1)
				if len(steps) >= count {
					break
				}
			}
		}
		if rs.IntN(sysDiskEvery) == 0 {
			n := ns[rs.IntN(len(ns))]
			at := len(steps) + 2 + rs.IntN(4)
			if loop && !n.sysFull {
				n.sysFull = true
				addStep(step{Kind: "sys-disk-full", Node: n.name})
				shiftPending(1)
				pending[at] = append(pending[at], step{Kind: "sys-disk-free", Node: n.name})
				if len(steps) >= count {
					break
				}
			}
		}
		if rf.IntN(fwReloadEvery) == 0 {
			n := ns[rf.IntN(len(ns))]
			addStep(step{Kind: "fw-reload", Node: n.name})
			shiftPending(1)
			if len(steps) >= count {
				break
			}
		}
		if rr.IntN(rotateEvery) == 0 && !ctlFull {
			addStep(step{Kind: "key-rotate"})
			continue
		}
		if rq.IntN(rekeyEvery) == 0 && !ctlFull {
			var hs []*simNode
			for _, n := range ns {
				if n.healthy() && !n.revoked {
					hs = append(hs, n)
				}
			}
			if len(hs) > 0 {
				addStep(step{Kind: "rekey", Node: hs[rq.IntN(len(hs))].name})
				continue
			}
		}
		if rp.IntN(pauseEvery) == 0 {
			addStep(step{Kind: "pause-serve", Proc: "serve", Arg: 2 + rp.IntN(9)})
			continue
		}
		if rk.IntN(clockEvery) == 0 {
			// A node's clock off by 1 to 6 hours, ahead or behind, for 2
			// to 7 steps: its executor and agent run on it (started again
			// with it, as after a reboot on a wrong clock), then on the
			// right one.
			n := ns[rk.IntN(len(ns))]
			if n.pendingEvents > 0 {
				continue
			}
			hours := 1 + rk.IntN(6)
			if rk.IntN(2) == 0 {
				hours = -hours
			}
			n.clockOff = true
			n.pendingEvents++
			addStep(step{Kind: "clock-off", Node: n.name, Arg: hours})
			at := len(steps) + 2 + rk.IntN(6)
			pending[at] = append(pending[at], step{Kind: "clock-right", Node: n.name})
			continue
		}
		kind := ""
		if x := rc.IntN(total + ctlTotal); x < ctlTotal {
			for _, w := range ctlWeights {
				if x < w.w {
					kind = w.kind
					break
				}
				x -= w.w
			}
		} else {
			x := r.IntN(total)
			for _, w := range weights {
				if x < w.w {
					kind = w.kind
					break
				}
				x -= w.w
			}
		}
		switch kind {
		case "declare", "plan":
			n := healthyNode()
			if kind == "declare" {
				n = pick()
			}
			if n == nil {
				continue
			}
			addStep(step{Kind: kind, Node: n.name, Doc: genDoc(r, 1+r.IntN(3))})
		case "assign":
			n := pick()
			m := genModule(r, modNames[r.IntN(len(modNames))])
			if overlay && !n.revoked && !ctlFull && !contains(n.assigned, m.Name) {
				n.assigned = append(n.assigned, m.Name)
			}
			if overlay && !n.revoked && !ctlFull {
				n.modules[m.Name] = m
			}
			addStep(step{Kind: kind, Node: n.name, Doc: []module{m}})
		case "unassign":
			n := pick()
			if len(n.assigned) == 0 {
				continue
			}
			i := r.IntN(len(n.assigned))
			m := n.assigned[i]
			if !n.revoked && !ctlFull {
				n.assigned = append(n.assigned[:i:i], n.assigned[i+1:]...)
			}
			addStep(step{Kind: kind, Node: n.name, Module: m})
		case "publish":
			n := pick()
			addStep(step{Kind: kind, Node: n.name})
		case "overlay":
			overlay = overlay || !ctlFull
			addStep(step{Kind: kind, Arg: []int{0, 10, 25, 60}[r.IntN(4)]})
		case "revoke":
			n := pick()
			n.revoked = n.revoked || !ctlFull
			addStep(step{Kind: kind, Node: n.name})
		case "reenrol":
			n := pick()
			if !n.healthy() {
				continue
			}
			n.revoked = n.revoked && ctlFull
			addStep(step{Kind: kind, Node: n.name})
		case "token":
			addStep(step{Kind: kind})
		case "rescue":
			n := pick()
			if n.execStopped || n.diskFull {
				continue
			}
			addStep(step{Kind: kind, Node: n.name, Doc: genRescue(r)})
		case "kill", "stop":
			n := pick()
			if n.pendingEvents > 0 {
				continue
			}
			proc := []string{"executor", "agent"}[r.IntN(2)]
			s := step{Kind: kind, Node: n.name, Proc: n.name + "/" + proc}
			back := step{Kind: "start", Node: n.name, Proc: s.Proc}
			if kind == "stop" {
				back.Kind = "cont"
			}
			switch {
			case proc == "executor" && kind == "kill":
				n.execDown = true
			case proc == "executor":
				n.execStopped = true
			case kind == "kill":
				n.agentDown = true
			default:
				n.agentStopped = true
			}
			n.pendingEvents++
			addStep(s)
			later(back)
		case "restart-serve", "kill-serve":
			if ctlFull && !restartOnFull {
				continue
			}
			addStep(step{Kind: kind, Proc: "serve"})
			if ctlFull {
				// Serve started on the full disk: drawn where it was
				// passed over before, and put between the others, which
				// come as they came.
				shiftPending(1)
			}
		case "power-cut":
			if !loop || ctlFull && !restartOnFull {
				continue
			}
			addStep(step{Kind: kind, Proc: "serve"})
			if ctlFull {
				shiftPending(1) // as a restart on the full disk is
			}
		case "ctl-disk-full":
			if ctlFull {
				continue
			}
			ctlFull = true
			addStep(step{Kind: kind})
			at := len(steps) + 1 + rc.IntN(4)
			pending[at] = append(pending[at], step{Kind: "ctl-disk-free"})
		case "second":
			n := pick()
			proc := []string{"executor", "agent", "serve"}[r.IntN(3)]
			if proc == "serve" {
				addStep(step{Kind: kind, Proc: "serve"})
			} else {
				addStep(step{Kind: kind, Node: n.name, Proc: n.name + "/" + proc})
			}
		case "second-socket":
			n := healthyNode()
			if n == nil {
				continue
			}
			addStep(step{Kind: kind, Node: n.name, Proc: n.name + "/executor"})
		case "disk-full":
			n := pick()
			if n.pendingEvents > 0 {
				continue
			}
			n.diskFull = true
			n.pendingEvents++
			addStep(step{Kind: kind, Node: n.name})
			later(step{Kind: "disk-free", Node: n.name})
		case "plan-paused":
			n := healthyNode()
			if n == nil || n.pendingEvents > 0 {
				continue
			}
			// The agent is stopped, a plan is sent and given up, and the
			// agent goes on a step later.
			n.agentStopped = true
			n.pendingEvents++
			addStep(step{Kind: "stop", Node: n.name, Proc: n.name + "/agent"})
			addStep(step{Kind: "plan", Node: n.name, Doc: genDoc(r, 1), Paused: true})
			at := len(steps) + 1
			pending[at] = append(pending[at], step{Kind: "cont", Node: n.name, Proc: n.name + "/agent"})
		}
	}
	// Every fault still in force is undone at the end, so the run ends on
	// a quiet mesh whose convergence is checked.
	var rest []int
	for at := range pending {
		rest = append(rest, at)
	}
	sort.Ints(rest)
	for _, at := range rest {
		for _, s := range pending[at] {
			undo(nodeOf(s.Node), s)
			addStep(s)
		}
	}
	drawExtras(seed, steps)
	return steps
}

// drawExtras gives the modules of the drawn steps, in order, their
// regions, openings, keys and archives, from an eighth stream of the seed's own: drawn
// after the steps, they leave the steps a seed drew before they were
// drawn as they were.
func drawExtras(seed uint64, steps []step) {
	re := rand.New(rand.NewPCG(seed, 0x657874726173)) // "extras"
	for i := range steps {
		if steps[i].Kind == "node-power-cut" {
			continue // drawn with the cut
		}
		for j := range steps[i].Doc {
			drawModuleExtras(re, &steps[i].Doc[j])
		}
	}
}

// drawModuleExtras draws m's region, opening, keys and archive.
func drawModuleExtras(re *rand.Rand, m *module) {
	if re.IntN(3) == 0 {
		m.Region = &regionRes{Version: re.Uint32() % 4, Lines: re.IntN(4)}
	}
	if re.IntN(4) == 0 {
		o := &openingRes{Path: "incoming", Protocol: "tcp"}
		if re.IntN(3) == 0 {
			o.Path = "forwarded"
		}
		if re.IntN(2) == 0 {
			o.Protocol = "udp"
		}
		o.From = openingFroms[re.IntN(len(openingFroms))]
		m.Opening = o
	}
	if re.IntN(3) == 0 {
		v := re.Uint32() % 4
		m.Keys = &v
	}
	if re.IntN(4) == 0 {
		k := re.IntN(chaosArchives)
		m.Archive = &k
	}
}

// openingFroms: anywhere (every family's chains), an IPv4 prefix (inet
// and ip), an IPv6 one (inet and ip6).
var openingFroms = []string{"", "", "10.9.0.0/16", "fd09::/32"}

var modNames = []string{"a", "b", "c", "d", "e"}

var fileNames = []string{"x", "y", "z", "w"}

var modes = []string{"0644", "0600", "0640", "0444", "0755"}

func genModule(r *rand.Rand, name string) module {
	m := module{Name: name}
	if r.IntN(3) == 0 {
		m.Subdir = "sub"
	}
	n := 1 + r.IntN(3)
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		f := fileNames[r.IntN(len(fileNames))]
		if m.Subdir != "" && r.IntN(2) == 0 {
			f = m.Subdir + "/" + f
		}
		if seen[f] {
			continue
		}
		seen[f] = true
		fr := fileRes{Name: f, Mode: modes[r.IntN(len(modes))], Version: r.Uint32() % 4}
		if r.IntN(5) == 0 {
			fr.Pad = r.IntN(20000)
		}
		m.Files = append(m.Files, fr)
	}
	return m
}

func genDoc(r *rand.Rand, n int) []module {
	perm := r.Perm(len(modNames))
	var ms []module
	for _, i := range perm[:n] {
		ms = append(ms, genModule(r, modNames[i]))
	}
	return ms
}

func genRescue(r *rand.Rand) []module {
	names := []string{"r1", "r2"}
	var ms []module
	for _, i := range r.Perm(2)[:1+r.IntN(2)] {
		ms = append(ms, genModule(r, names[i]))
	}
	return ms
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
