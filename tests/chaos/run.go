package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/cli"
)

// docJSON is the declaration of ms for n: the link's modules under L/,
// a rescue file's under R/ and naming the node.
func (w *world) docJSON(n *node, ms []module, rescue bool) []byte {
	var rs []map[string]any
	for _, m := range ms {
		dir := modDir(n, m.Name)
		rs = append(rs, map[string]any{"module": m.Name, "id": "dir", "type": "directory", "path": dir})
		if m.Subdir != "" {
			rs = append(rs, map[string]any{"module": m.Name, "id": "sub", "type": "directory", "path": dir + "/" + m.Subdir})
		}
		if k := m.Archive; k != nil {
			a := w.archives[*k]
			url := a.url
			if rescue {
				url = "file://" + a.file
			}
			rs = append(rs, map[string]any{"module": m.Name, "id": "arch", "type": "archive", "url": url, "sha256": a.sha256, "destination": dir})
		}
		for _, f := range m.Files {
			id := fileID(f.Name)
			rs = append(rs, map[string]any{"module": m.Name, "id": id, "type": "file", "path": dir + "/" + f.Name,
				"content": fileContent(m.Name, id, f), "mode": f.Mode})
		}
		if g := m.Region; g != nil {
			rs = append(rs, map[string]any{"module": m.Name, "id": "reg", "type": "region", "path": n.shared(),
				"content": regionContent(m.Name, g)})
		}
		if o := m.Opening; o != nil {
			r := map[string]any{"module": m.Name, "id": "open", "type": "opening", "port": portOf(m.Name),
				"protocol": o.Protocol, "path": o.Path}
			if o.From != "" {
				r["from"] = o.From
			}
			rs = append(rs, r)
		}
		if v := m.Keys; v != nil {
			set := map[string]string{"mod_" + m.Name: keysValue(m.Name, *v)}
			if m.Name == foundKeysModule {
				set[foundKey] = keysValue(m.Name, *v)
			}
			rs = append(rs, map[string]any{"module": m.Name, "id": "keys", "type": "keys", "path": n.sharedEnv(),
				"format": "equals", "set": set})
		}
	}
	d := map[string]any{"version": 1, "resources": rs}
	if rescue {
		d["node"] = n.name
	}
	b, _ := json.Marshal(d)
	return b
}

func modDir(n *node, mod string) string {
	if strings.HasPrefix(mod, "r") {
		return filepath.Join(n.tree, "R", mod)
	}
	return filepath.Join(n.tree, "L", mod)
}

func fileID(name string) string { return "f_" + strings.ReplaceAll(name, "/", "_") }

// fileContent names the resource and the mode it is declared with: what
// the machine holds can be checked against any store claim on its own.
func fileContent(mod, id string, f fileRes) string {
	return fmt.Sprintf("chaos %s.%s v%d mode=%s\n%s", mod, id, f.Version, f.Mode, strings.Repeat(".", f.Pad))
}

// regionContent names the region's module, id and version, as a file's
// content does.
func regionContent(mod string, g *regionRes) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos-region %s.reg v%d\n", mod, g.Version)
	for i := range g.Lines {
		fmt.Fprintf(&b, "%s line %d\n", mod, i+1)
	}
	return b.String()
}

// keysValue names the module and the version of its keys.
func keysValue(mod string, v uint32) string { return fmt.Sprintf("%s-v%d", mod, v) }

// portOf is a module's port: each module opens its own, so that an
// opening's rule names the one module that declares it.
func portOf(mod string) int {
	if i := slices.Index(modNames, mod); i >= 0 {
		return 10001 + i
	}
	if mod == "r2" {
		return 10012
	}
	return 10011
}

// idPath is the path a report line's resource names, "" for one that is
// not a path (the overlay).
func idPath(n *node, mod, id string) string {
	if !contains(modNames, mod) && mod != "r1" && mod != "r2" {
		return ""
	}
	dir := modDir(n, mod)
	switch {
	case id == "dir":
		return dir
	case id == "sub":
		return dir + "/sub"
	case strings.HasPrefix(id, "f_sub_"):
		return dir + "/sub/" + strings.TrimPrefix(id, "f_sub_")
	case strings.HasPrefix(id, "f_"):
		return dir + "/" + strings.TrimPrefix(id, "f_")
	}
	return ""
}

func (w *world) writeDoc(n *node, b []byte) string {
	f := filepath.Join(w.base, fmt.Sprintf("step-%d-%s.json", w.stepN, n.name))
	os.WriteFile(f, b, 0o600)
	return f
}

func (w *world) nodeNamed(name string) *node {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (w *world) procNamed(name string) *proc {
	if name == "serve" {
		return w.serve
	}
	n := w.nodeNamed(strings.Split(name, "/")[0])
	if strings.HasSuffix(name, "/executor") {
		return n.exec
	}
	return n.agentP
}

// ack notes a sequence the control side acknowledged for a node.
func (w *world) ack(name string, seq uint64) {
	if n := w.nodeNamed(name); n != nil && seq > n.acked {
		n.acked = seq
	}
}

// expectRefusal is an operator's command the control side must refuse,
// saying why (one of the reasons why separates by "|": a revoked node
// without an overlay may be refused for either).
func (w *world) expectRefusal(n *node, what string, out string, code int, err error, why string) {
	w.check("refused-legibly")
	said := false
	for _, w := range strings.Split(why, "|") {
		said = said || strings.Contains(out, w)
	}
	if err != nil || code == 0 || !said {
		w.violate(n, "refused-legibly", "%s: expected a refusal saying %q, got exit %d %v:\n%s", what, why, code, err, out)
	}
}

func (w *world) expectOK(n *node, what string, out string, code int, err error) bool {
	w.check("command-answers")
	if err != nil || code != 0 {
		w.violate(n, "command-answers", "%s: exit %d %v:\n%s", what, code, err, out)
		return false
	}
	return true
}

// do runs one step.
func (w *world) do(s step) {
	n := w.nodeNamed(s.Node)
	if w.ctlFull {
		// What the broker freed since (a block of messages removed) is
		// taken again: the disk stays full for the whole fault.
		fillUp(w.ctlFiller)
	}
	if s.Known != "" && n != nil {
		n.known, n.knownUntil = s.Known, s.N+5
	}
	switch s.Kind {
	case "declare":
		f := w.writeDoc(n, w.docJSON(n, s.Doc, false))
		args := []string{"declare", n.name, f, "--json"}
		if w.overlay {
			args = append(args, "--without-overlay")
		}
		out, code, err := w.control(args...)
		if w.ctlFull && w.refusedFull(n, "declare", out, code, err, "revoked") {
			return
		}
		if n.revoked {
			w.expectRefusal(n, "declare to a revoked node", out, code, err, "revoked")
			return
		}
		if w.expectOK(n, "declare", out, code, err) {
			var r struct {
				Seq uint64 `json:"seq"`
			}
			json.Unmarshal([]byte(jsonPart(out)), &r)
			w.ack(n.name, r.Seq)
		}
	case "assign":
		f := w.writeDoc(n, w.docJSON(n, s.Doc, false))
		out, code, err := w.control("assign", n.name, f, "--json")
		if w.ctlFull && w.refusedFull(n, "assign", out, code, err, "no overlay is set|revoked") {
			return
		}
		switch {
		case !w.overlay && n.revoked:
			w.expectRefusal(n, "assign to a revoked node before an overlay", out, code, err, "no overlay is set|revoked")
		case !w.overlay:
			w.expectRefusal(n, "assign before an overlay", out, code, err, "no overlay is set")
		case n.revoked:
			w.expectRefusal(n, "assign to a revoked node", out, code, err, "revoked")
		case w.expectOK(n, "assign", out, code, err):
			var r struct {
				Seq  uint64 `json:"seq"`
				Sent bool   `json:"sent"`
			}
			json.Unmarshal([]byte(jsonPart(out)), &r)
			if r.Sent {
				w.ack(n.name, r.Seq)
			}
		}
	case "unassign":
		out, code, err := w.control("unassign", n.name, s.Module, "--json")
		if w.ctlFull && w.refusedFull(n, "unassign", out, code, err, "is not assigned|revoked") {
			return
		}
		if code == 0 && err == nil {
			var r struct {
				Seq  uint64 `json:"seq"`
				Sent bool   `json:"sent"`
			}
			json.Unmarshal([]byte(jsonPart(out)), &r)
			if r.Sent {
				w.ack(n.name, r.Seq)
			}
		} else {
			w.logf("  unassign refused: %s", firstLine(out))
		}
	case "publish":
		out, code, err := w.control("publish", n.name, "--json")
		if w.ctlFull && w.refusedFull(n, "publish", out, code, err, "no overlay is set|revoked") {
			return
		}
		if !w.overlay {
			w.expectRefusal(n, "publish before an overlay", out, code, err, "no overlay is set|revoked")
			return
		}
		if n.revoked {
			w.expectRefusal(n, "publish to a revoked node", out, code, err, "revoked")
			return
		}
		if w.expectOK(n, "publish", out, code, err) {
			w.ackPublished(out)
		}
	case "plan":
		f := w.writeDoc(n, w.docJSON(n, s.Doc, false))
		wait := "--wait=60s"
		if s.Paused {
			wait = "--wait=3s"
		}
		if w.ctlFull {
			// The node's answer cannot be recorded: the plan is answered
			// or refused saying the disk is full, soon.
			wait = "--wait=10s"
		}
		out, code, err := w.control("plan", n.name, f, "--json", wait)
		w.check("plan-answers")
		if w.ctlFull && err == nil && code != 0 && strings.Contains(out, diskFullSays) {
			return
		}
		if !s.Paused && (err != nil || code == 3) {
			w.violate(n, "plan-answers", "a plan to a linked node had no answer: exit %d %v\n%s", code, err, out)
		}
		if !s.Paused && err == nil && code != 3 && n.skewShown {
			// A plan request is good for minutes by the control side's
			// clock: a node hours off refuses it, and the operator is
			// told the two clocks differ.
			w.check("plan-says-clocks-differ")
			if !strings.Contains(out, "the two clocks differ") {
				w.violate(n, "plan-says-clocks-differ", "a plan to a node whose clock is %s off was not refused saying the clocks differ: exit %d\n%s", n.skew, code, out)
			}
		}
	case "overlay":
		out, code, err := w.control("overlay", "set", "--network", "10.231.0.0/24", "--interface", "chaos0",
			"--keepalive", strconv.Itoa(s.Arg), "--json")
		if w.ctlFull && w.refusedFull(nil, "overlay set", out, code, err, "") {
			// Its settings may be kept though their publishing was
			// refused, which it says: the overlay is set then.
			w.overlay = w.overlay || strings.Contains(out, "the overlay is set (")
			return
		}
		if w.expectOK(nil, "overlay set", out, code, err) {
			w.overlay = true
			w.ackPublished(out)
		}
	case "revoke":
		out, code, err := w.control("node", "revoke", n.name, "--json")
		// Revoking a revoked node writes nothing, and answers so.
		if w.ctlFull && !n.revoked && w.refusedFull(n, "node revoke", out, code, err, "") {
			return
		}
		if w.expectOK(n, "node revoke", out, code, err) {
			n.revoked = true
			w.faults["revoke"]++
		}
	case "reenrol":
		if w.ctlFull {
			out, code, err := w.control("token", "issue", "--node", n.name)
			if w.refusedFull(n, "token issue --node", out, code, err, "") {
				return
			}
			// Issued on a full disk (into room the broker's files had):
			// enrolled with, so the model follows what was acknowledged.
			out, code, err = w.onNode(n, 2*time.Minute, lastLine(out)+"\n", "enrol", "--state", n.state, "--socket", n.sock, "--wait", "60s")
			switch {
			case err == nil && code != 0 && strings.Contains(out, diskFullSays) && strings.Contains(out, " is full"):
				// Refused for the disk: the token is not spent, nothing is
				// recorded, and it says so. The operator ends the pending
				// enrolment (which the agent would carry out minutes
				// later, behind the model's back); the node keeps its
				// earlier enrolment, revoked or not.
				w.check("refused-legibly")
				if out, code, err := w.onNode(n, time.Minute, "", "enrol", "--cancel", "--state", n.state); err != nil || code != 0 {
					w.violate(n, "reenrol", "enrol --cancel %s after a refusal: %v exit %d\n%s", n.name, err, code, out)
				}
			case err != nil || code != 0:
				w.violate(n, "reenrol", "enrol %s: %v exit %d\n%s", n.name, err, code, out)
			default:
				n.revoked = false
			}
			return
		}
		w.check("reenrol")
		if err := w.enrol(n, "--node", n.name); err != nil {
			w.violate(n, "reenrol", "%v", err)
		}
	case "rekey":
		// The node's keys renewed over the link: it is enrolled again as
		// itself, and goes on as the node it was (what it holds, what it
		// is declared), which the invariants then hold it to.
		var before nodeView
		if vs, err := w.nodesView(); err == nil {
			before = vs[n.name]
		}
		if sysFull(n) {
			// Its agent cannot keep the new enrolment's key: the rekey
			// ends pending, and finishes once there is room (sys-disk-free
			// looks).
			out, code, err := w.onNode(n, 2*time.Minute, "", "rekey", "--state", n.state, "--socket", n.sock, "--wait", "10s")
			w.check("rekey")
			switch {
			case err == nil && code == 0 && strings.Contains(out, "rekeyed: enrolled as node "+n.name):
				w.faults["rekey"]++
			case err == nil && code == 3 && strings.Contains(out, "the rekey is pending"):
				w.faults["rekey (pending until the disk has room)"]++
				n.rekeyOnRoom = &before
			case err == nil && code == 2 && n.rekeyOnRoom != nil && strings.Contains(out, "it renews the keys already"):
				// Asked again while the first rekey's enrolment waits for
				// room (its answer came, its grant not yet kept): refused
				// before anything changed, saying the pending one renews
				// the keys; the first finishes once there is room.
				w.faults["rekey (its enrolment pending already)"]++
			default:
				w.violate(n, "rekey", "mesh-executor rekey %s on a full system disk: %v exit %d, expected rekeyed or pending:\n%s", n.name, err, code, out)
				w.onNode(n, time.Minute, "", "rekey", "--cancel", "--state", n.state)
			}
			return
		}
		out, code, err := w.onNode(n, 2*time.Minute, "", "rekey", "--state", n.state, "--socket", n.sock, "--wait", "90s")
		w.check("rekey")
		if err != nil || code != 0 || !strings.Contains(out, "rekeyed: enrolled as node "+n.name) {
			w.violate(n, "rekey", "mesh-executor rekey %s: %v exit %d\n%s", n.name, err, code, out)
			// No rekey left pending behind the model's back.
			w.onNode(n, time.Minute, "", "rekey", "--cancel", "--state", n.state)
			return
		}
		w.faults["rekey"]++
		if err := w.firstComposition(n, before); err != nil {
			w.violate(n, "rekey", "%v", err)
		}
	case "key-rotate":
		out, code, err := w.control("key", "rotate", "--json")
		if w.expectOK(nil, "key rotate", out, code, err) {
			w.faults["key-rotate"]++
		}
	case "cert-rotate":
		out, code, err := w.control("cert", "rotate", "--json")
		var res struct {
			Seq uint64 `json:"seq"`
		}
		if w.expectOK(nil, "cert rotate", out, code, err) && json.Unmarshal([]byte(jsonPart(out)), &res) == nil {
			w.faults["cert-rotate"]++
			w.pinsSeq = res.Seq
		}
	case "cert-switch":
		w.certSwitch()
	case "token":
		w.spares++
		name := fmt.Sprintf("spare%d", w.spares)
		out, code, err := w.control("token", "issue", "--new", "--name", name)
		if w.ctlFull && w.refusedFull(nil, "token issue", out, code, err, "") {
			return
		}
		w.expectOK(nil, "token issue", out, code, err)
	case "rescue":
		f := w.writeDoc(n, w.docJSON(n, s.Doc, true))
		// In the node's network namespace, as its executor runs: a
		// rescue file's openings are written into the node's firewall.
		out, code, err := w.inNetns(n, 2*time.Minute, "mesh-executor", "apply", f, "--state", n.state, "--json", "--wait", "90s")
		w.check("rescue-applies")
		if err != nil || (code != 0 && code != 1) {
			w.violate(n, "rescue-applies", "mesh-executor apply: exit %d %v\n%s", code, err, out)
		}
		var r struct {
			Lines []line `json:"lines"`
		}
		json.Unmarshal([]byte(jsonPart(out)), &r)
		n.rescue = append(n.rescue, r.Lines...)
	case "kill":
		if procKind(s.Proc) == "executor" {
			w.killExecutor(n, s.N%3)
			break
		}
		w.faults["kill -9 "+procKind(s.Proc)]++
		w.end(w.procNamed(s.Proc), syscall.SIGKILL)
	case "start":
		switch {
		case strings.HasSuffix(s.Proc, "/executor") && n.childKilled:
			// Its launcher starts it again, after its backoff (1s).
			n.childKilled = false
			w.check("launcher-restarts")
			if !w.eventually(30*time.Second, func() bool { return w.executorPid(n) != 0 }) {
				w.violate(n, "launcher-restarts", "%s's launcher has not started an executor again within 30s of the last one's kill -9:\n%s", n.name, tailOf(n.exec.log, 1500))
			}
		case strings.HasSuffix(s.Proc, "/executor"):
			w.startExecutor(n)
		default:
			w.startAgent(n)
		}
	case "stop":
		w.faults["SIGSTOP "+procKind(s.Proc)]++
		p := w.procNamed(s.Proc)
		if procKind(s.Proc) == "executor" {
			// The executor, not its launcher, which would only stop
			// restarting it.
			if pid := w.executorPid(n); pid != 0 {
				syscall.Kill(pid, syscall.SIGSTOP)
				p.stoppedPid = pid
			}
		} else {
			p.cmd.Process.Signal(syscall.SIGSTOP)
		}
		p.stopped = true
	case "cont":
		p := w.procNamed(s.Proc)
		if p.stoppedPid != 0 {
			syscall.Kill(p.stoppedPid, syscall.SIGCONT)
		} else {
			p.cmd.Process.Signal(syscall.SIGCONT)
		}
		p.stopped, p.stoppedPid = false, 0
	case "restart-serve":
		w.faults["restart serve"]++
		w.end(w.serve, syscall.SIGTERM)
		w.startServe()
	case "kill-serve":
		w.faults["kill -9 serve"]++
		w.end(w.serve, syscall.SIGKILL)
		w.startServe()
	case "second":
		// A second instance is second only while the first runs: one
		// killed a step before is not there to hold the state (its init
		// would start one again, and it is started again later here), so
		// this one would be the only one and rightly serve.
		if first := w.first(n, s.Proc); first != nil && !first.running() {
			w.logf("  (the first %s is down: no second instance started)", s.Proc)
			break
		}
		if procKind(s.Proc) == "executor" && s.N%2 == 0 {
			w.faults["second launcher"]++
			w.secondLauncher(n)
			break
		}
		// Nor is an executor the launcher is starting again (killed a
		// step before): the state is free until it serves, and a second
		// started then takes it rightly (the launcher waits for it to
		// end, launcher TestAnotherExecutorHoldingTheStateIsWaitedFor).
		if procKind(s.Proc) == "executor" && !w.eventually(30*time.Second, func() bool { return serveLocked(n.state) }) {
			w.logf("  (no executor serves %s's state: no second instance started)", n.name)
			break
		}
		w.faults["second "+procKind(s.Proc)]++
		w.second(n, s.Proc)
	case "second-socket":
		w.faults["second executor on the socket"]++
		w.secondOnSocket(n)
	case "pause-serve":
		// Stopped and continued within the step: what it answers after
		// is checked by every invariant, and it must answer at once.
		w.faults["SIGSTOP serve (continued)"]++
		w.serve.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(time.Duration(s.Arg) * time.Second)
		w.serve.cmd.Process.Signal(syscall.SIGCONT)
		w.check("serve-up")
		if !w.eventually(60*time.Second, func() bool { _, code, err := w.control("nodes", "--json"); return err == nil && code == 0 }) {
			w.violate(nil, "serve-up", "mesh-control serve did not answer `nodes` within 60s of its continuing after a pause of %ds", s.Arg)
		}
	case "clock-off":
		w.faults["node clock off by hours"]++
		w.setClock(n, time.Duration(s.Arg)*time.Hour)
	case "clock-right":
		w.setClock(n, 0)
	case "disk-full":
		w.faults["full disk (node state)"]++
		fill(n.filler)
	case "disk-free":
		os.Remove(n.filler)
	case "fw-reload":
		w.faults["firewall loaded again (node)"]++
		w.check("firewall-put-back")
		if err := reloadFirewall(n); err != nil {
			w.violate(n, "firewall-put-back", "%s: loading its firewall again: %v", n.name, err)
			break
		}
		// An executor that runs puts the mesh's rules back within
		// seconds (it watches the ruleset); one stopped or down does it
		// once it runs again, its start or its watch, and the looks of
		// the steps after hold it then.
		if n.exec.running() && !n.exec.stopped && !n.childKilled && w.executorPid(n) != 0 {
			var last []problem
			if !w.eventually(30*time.Second, func() bool {
				owned, err := w.ownedBy(n)
				if err != nil {
					return false
				}
				last = nil
				for _, p := range w.hostMadeProblems(n, owned) {
					if p.inv == "host-firewall-kept" {
						last = append(last, p)
					}
				}
				return len(last) == 0
			}) {
				w.violate(n, "firewall-put-back", "%s's firewall was loaded again, and 30 s later it does not hold what the store claims: %v", n.name, last)
			}
		}
	case "sys-disk-full":
		w.faults["full disk (node system)"]++
		fillUp(n.sysFiller)
	case "sys-disk-free":
		os.Remove(n.sysFiller)
		if before := n.enrolOnRoom; before != nil {
			n.enrolOnRoom = nil
			w.check("reenrol")
			var last nodeView
			if !w.eventually(w.cfg.bound, func() bool {
				vs, err := w.nodesView()
				last = vs[n.name]
				return err == nil && last.Enrolment != "" && last.Enrolment != before.Enrolment && last.State != "revoked"
			}) {
				w.violate(n, "reenrol", "%s's enrolment, pending while its system disk was full, did not finish within %s of room (enrolment %s, before it %s)", n.name, w.cfg.bound, last.Enrolment, before.Enrolment)
			} else {
				n.revoked = false
				if err := w.firstComposition(n, *before); err != nil {
					w.violate(n, "reenrol", "%v", err)
				}
			}
		}
		if before := n.rekeyOnRoom; before != nil {
			n.rekeyOnRoom = nil
			w.check("rekey")
			var last nodeView
			if !w.eventually(w.cfg.bound, func() bool {
				vs, err := w.nodesView()
				last = vs[n.name]
				return err == nil && last.Enrolment != "" && last.Enrolment != before.Enrolment
			}) {
				w.violate(n, "rekey", "%s's rekey, pending while its system disk was full, did not finish within %s of room (enrolment %s, before it %s)", n.name, w.cfg.bound, last.Enrolment, before.Enrolment)
			} else if err := w.firstComposition(n, *before); err != nil {
				w.violate(n, "rekey", "%v", err)
			}
		}
	case "power-cut":
		w.faults["power cut (control side)"]++
		w.powerCut()
	case "node-power-cut":
		w.faults["power cut (node)"]++
		w.check("node-power-cut")
		// A declaration acknowledged, and the power cut Arg ms later:
		// before the node has it, while it applies, records or reports,
		// or after.
		w.do(step{N: s.N, Kind: "declare", Node: s.Node, Doc: s.Doc})
		after := s.Arg
		if nodeCutAt >= 0 {
			after = nodeCutAt
		}
		time.Sleep(time.Duration(after) * time.Millisecond)
		w.nodeCut(n)
	case "ctl-disk-full":
		w.faults["full disk (control side)"]++
		w.ctlFull = true
		fillUp(w.ctlFiller)
	case "ctl-disk-free":
		w.ctlFree()
	default:
		panic("no such step kind " + s.Kind)
	}
}

func procKind(name string) string {
	if i := strings.IndexByte(name, '/'); i >= 0 {
		return name[i+1:]
	}
	return name
}

func (w *world) ackPublished(out string) {
	var r struct {
		Published []struct {
			Node string `json:"node"`
			Seq  uint64 `json:"seq"`
			Sent bool   `json:"sent"`
		} `json:"published"`
	}
	json.Unmarshal([]byte(jsonPart(out)), &r)
	for _, p := range r.Published {
		if p.Sent {
			w.ack(p.Node, p.Seq)
		}
	}
}

// second starts another instance of the daemon name on the same state,
// which must be refused, saying so, within a bound.
// first is the running instance a second one of name would meet.
func (w *world) first(n *node, name string) *proc {
	switch procKind(name) {
	case "serve":
		return w.serve
	case "executor":
		return n.exec
	case "agent":
		return n.agentP
	}
	return nil
}

func (w *world) second(n *node, name string) {
	var argv []string
	switch procKind(name) {
	case "serve":
		argv = []string{filepath.Join(w.bin, "mesh-control"), "serve", "--dir", w.ctl, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort())}
	case "executor":
		// The same state, another socket: the state's lock must refuse it.
		argv = []string{filepath.Join(w.bin, "mesh-executor"), "serve", "--state", n.state, "--socket", n.sock + ".second",
			"--agent-user", "nobody", "--agent-state", n.agent, "--drift", "0", "--build", "chaos"}
	case "agent":
		argv = w.agentArgv(n)
	}
	p := w.start(name+"#second", argv)
	w.check("second-refused")
	select {
	case <-p.ended:
		if p.cmd.ProcessState.ExitCode() == 0 {
			w.violate(n, "second-refused", "a second %s exited 0: it must say it was refused", name)
		}
	case <-time.After(30 * time.Second):
		w.violate(n, "second-refused", "a second %s on the same state still runs after 30s", name)
		w.end(p, syscall.SIGTERM)
	}
	p.expected = true
}

// secondOnSocket starts an executor with a state of its own on n's
// socket: it must be refused, and n's executor must stay reachable.
func (w *world) secondOnSocket(n *node) {
	state, _ := os.MkdirTemp(w.base, "second-state-")
	os.Chmod(state, 0o700)
	p := w.start(n.name+"/executor#socket", []string{filepath.Join(w.bin, "mesh-executor"), "serve", "--state", state, "--socket", n.sock,
		"--agent-user", "nobody", "--agent-state", n.agent + ".second", "--drift", "0", "--build", "chaos"})
	w.check("second-refused")
	select {
	case <-p.ended:
	case <-time.After(5 * time.Second):
		w.violate(n, "second-refused", "a second executor on %s's socket still runs after 5s", n.name)
		w.end(p, syscall.SIGTERM)
	}
	p.expected = true
	w.check("socket-kept")
	if _, err := os.Stat(n.sock); err != nil {
		w.violate(n, "socket-kept", "%s's executor socket is gone after a second executor ended: %v", n.name, err)
		// What was broken is healed, so the run goes on to find the next.
		w.end(n.exec, syscall.SIGTERM)
		w.startExecutor(n)
	}
}

// fill writes to path until the filesystem holding it is full.
func fill(path string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	for {
		if _, err := f.Write(buf); err != nil {
			return
		}
	}
}

// jsonPart is the first JSON value in a command's output (standard
// output, which comes first, then standard error).
func jsonPart(out string) string {
	i := strings.Index(out, "{")
	if i < 0 {
		return ""
	}
	var v json.RawMessage
	if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&v); err != nil {
		return ""
	}
	return string(v)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// setClock starts n's executor and agent again on a clock off by skew
// (none: the right one), as a machine rebooted onto a wrong clock, then
// checks that the control side shows the skew beside the node (one over
// a minute) or shows none, by its own clock, once the node has said
// anything. A node it cannot hear from (revoked, a full control disk)
// is not looked at.
func (w *world) setClock(n *node, skew time.Duration) {
	w.end(n.agentP, syscall.SIGTERM)
	w.end(n.exec, syscall.SIGTERM)
	n.skew, n.skewShown = skew, false
	w.startExecutor(n)
	w.startAgent(n)
	if n.revoked || w.ctlFull {
		return
	}
	w.check("clock-skew-shown")
	var said int64
	ok := w.eventually(60*time.Second, func() bool {
		out, code, err := w.control("nodes", "--json")
		if err != nil || code != 0 {
			return false
		}
		var ns []struct {
			Name        string `json:"name"`
			ClockSkewMS int64  `json:"clock_skew_ms"`
		}
		if json.Unmarshal([]byte(jsonArray(out)), &ns) != nil {
			return false
		}
		for _, v := range ns {
			if v.Name == n.name {
				said = v.ClockSkewMS
				off := time.Duration(v.ClockSkewMS)*time.Millisecond - skew
				return off > -time.Minute && off < time.Minute && (skew != 0) == (v.ClockSkewMS != 0)
			}
		}
		return false
	})
	if !ok {
		w.violate(n, "clock-skew-shown", "%s's clock is %s off; 60s after its executor and agent started on it, mesh-control nodes shows a skew of %s", n.name, skew, time.Duration(said)*time.Millisecond)
		return
	}
	n.skewShown = skew != 0
}

// killExecutor ends n's executor by one of three ways (how): 0, its
// launcher killed -9 (as a service's main process dies): the executor
// must then end on its parent-death signal, and the step that undoes it
// starts the service again, as the init would; 1, the service stopped as
// the init stops it (SIGTERM to the launcher): the executor ends the apply
// in progress between two steps and exits within the launcher's stop
// timeout (10 s here), and the step that undoes it starts the service
// again; else the executor alone killed -9, which its launcher must start
// again by itself (the step that undoes it looks).
func (w *world) killExecutor(n *node, how int) {
	pid := w.executorPid(n)
	switch how {
	case 0:
		w.faults["kill -9 launcher (and so its executor)"]++
		w.end(n.exec, syscall.SIGKILL)
		if pid == 0 {
			return
		}
		w.check("executor-ends-with-launcher")
		gone := w.eventually(20*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		if !gone {
			w.violate(n, "executor-ends-with-launcher", "%s's executor (pid %d) still runs 20s after its launcher was killed: it holds the state the next launcher's executor needs", n.name, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	case 1:
		w.faults["SIGTERM launcher (the init's stop)"]++
		w.check("stop-ends")
		start := time.Now()
		w.end(n.exec, syscall.SIGTERM)
		if took := time.Since(start); took > 15*time.Second {
			w.violate(n, "stop-ends", "%s's launcher took %s to end after SIGTERM (its --stop-timeout is 10s):\n%s", n.name, took.Round(time.Millisecond), tailOf(n.exec.log, 1500))
		}
		if pid != 0 && !w.eventually(5*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
			w.violate(n, "stop-ends", "%s's executor (pid %d) still runs after its launcher ended on SIGTERM", n.name, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	default:
		w.faults["kill -9 executor (its launcher restarts it)"]++
		if pid == 0 {
			w.logf("  (no executor under %s's launcher to kill)", n.name)
		} else {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		n.childKilled = true
	}
}

// secondLauncher starts another mesh-launch on n's state, as a person
// might by hand while the init's runs: it must be refused at once, saying
// so, and count nothing in the launch state the first one keeps.
func (w *world) secondLauncher(n *node) {
	before, berr := w.launchStarts(n)
	p := w.start(n.name+"/launcher#second", w.executorArgv(n, n.state, n.sock))
	w.check("second-refused")
	select {
	case <-p.ended:
		if p.cmd.ProcessState.ExitCode() == 0 {
			w.violate(n, "second-refused", "a second mesh-launch on %s's state exited 0: it must say it was refused", n.name)
		}
	case <-time.After(30 * time.Second):
		w.violate(n, "second-refused", "a second mesh-launch on %s's state still runs after 30s", n.name)
		w.end(p, syscall.SIGTERM)
	}
	p.expected = true
	if berr != nil || n.childKilled {
		return
	}
	w.check("second-counts-nothing")
	if after, err := w.launchStarts(n); err == nil && after > before {
		w.violate(n, "second-counts-nothing", "the launch state of %s counts %d starts after a second mesh-launch was refused, %d before", n.name, after, before)
	}
}

// launchStarts is how many starts n's launch state counts now, as
// mesh-launch status --json says.
func (w *world) launchStarts(n *node) (int, error) {
	out, code, err := w.cliEnv(n.env(), time.Minute, "", "mesh-launch", "status", "--state", n.state, "--json")
	if err != nil || code != 0 {
		return 0, fmt.Errorf("mesh-launch status: exit %d %v %s", code, err, firstLine(out))
	}
	var st struct {
		Starts []time.Time `json:"starts"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &st); err != nil {
		return 0, err
	}
	return len(st.Starts), nil
}

// certSwitch switches the broker's certificate to the one announced
// (cert rotate --switch) once every quiet node holds the announcement —
// a quiet node that has not taken it within the bound is pins-in-force's
// violation, checked after the step — and holds the control side to its
// answer: switched, or refused naming only nodes that are not quiet (away,
// stopped, revoked: they would not link after the switch). A refused
// switch leaves the announcement in force; the next cert-rotate announces
// the same certificate again. While the control side's disk is full the
// switch is not tried: it writes the key directory.
func (w *world) certSwitch() {
	if w.ctlFull || w.pinsSeq == 0 {
		return
	}
	// A node whose system disk is full cannot keep the statement, and is
	// refused taking it: one the switch may name, as one not quiet.
	ready := func(n *node) bool { return w.quiet(n) && !sysFull(n) }
	for _, n := range w.nodes {
		if ready(n) {
			// Taken, and heard taken: the switch goes by the heartbeats
			// the control side has.
			w.eventually(w.cfg.bound, func() bool {
				vs, err := w.nodesView()
				return err == nil && w.pinsHeld(n) >= w.pinsSeq && vs[n.name].Heartbeat.BrokerPinsSeq >= w.pinsSeq
			})
		}
	}
	out, code, err := w.control("cert", "rotate", "--switch", "--json")
	var res struct {
		Phase  string   `json:"phase"`
		Seq    uint64   `json:"seq"`
		NotYet []string `json:"not_yet"`
	}
	json.Unmarshal([]byte(jsonPart(out)), &res)
	w.check("command-answers")
	switch {
	case err == nil && code == 0 && res.Phase == "switched":
		w.faults["cert-switch"]++
		w.pinsSeq = res.Seq
	case len(res.NotYet) > 0:
		for _, name := range res.NotYet {
			if n := w.nodeNamed(name); n != nil && ready(n) {
				w.check("pins-in-force")
				w.violate(n, "pins-in-force", "cert rotate --switch refused naming %s, quiet, its agent holding statement %d of %d:\n%s", name, w.pinsHeld(n), w.pinsSeq, out)
			}
		}
	default:
		w.violate(nil, "command-answers", "cert rotate --switch: exit %d %v:\n%s", code, err, out)
	}
}

// pinsHeld is the broker certificates' statement the node's agent took
// last, as its state says (0: none, or no state yet).
func (w *world) pinsHeld(n *node) uint64 {
	var st struct {
		PinsSeq uint64 `json:"pins_seq"`
	}
	b, _ := os.ReadFile(filepath.Join(n.agent, "agent.json"))
	json.Unmarshal(b, &st)
	return st.PinsSeq
}

// serveLocked says whether a mesh-executor serve holds state's lock
// (executor/cli.ServeLockFile) now, by the pid it records there being
// alive: a probe that takes no lock, so that it never refuses the serve
// it looks for.
func serveLocked(state string) bool {
	b, err := os.ReadFile(filepath.Join(state, cli.ServeLockFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && pid > 0 && unix.Kill(pid, 0) == nil
}
