package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/engine"
	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/serve"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A check's status: ok, warn (worth a look; the command still exits 0) or
// fail (exit 1).
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
)

// check is one line of `mesh-executor doctor`: what was looked at, how it
// is, what was seen and, when it is not ok, what to do.
type check struct {
	Check  string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Thresholds of the disk check, on the space free to the filesystem's
// users (df's "Avail") where the state directory is.
const (
	diskWarnFraction = 10               // percent
	diskWarnBytes    = 64 << 20         // 64 MiB
	diskFailBytes    = 1 << 20          // 1 MiB: an apply's intent record may not fit
	doctorDialWithin = 2 * time.Second  // a live executor accepts at once
	doctorInitWithin = 10 * time.Second // systemd's bus, runit's and s6's tools
)

// doctor checks, read-only, what an operator looks at when a node
// misbehaves; every check is said, and the exit status is 1 when one
// failed. It creates nothing (not the state directory) and dials nothing
// but the executor's own local socket.
func (c *command) doctor() int {
	if !c.needRoot("doctor") {
		return ExitRefused
	}
	now := clock.Now()
	dir, exists := stateCheck(c.state)
	var id *identity.Identity
	var idErr error
	var pending *enrol.PendingView
	var rekey *enrol.RekeyView
	var link *serve.LinkState
	var linkErr error
	var faults serve.Faults
	var faultsErr error
	var st *store.Store
	if exists {
		var err error
		if st, _, err = store.Peek(c.state); err != nil && dir.Status == checkOK {
			// The daemon refuses to start on a store that does not read:
			// said here, where the rest looks healthy.
			dir.Status, dir.Detail = checkFail, dir.Detail+"; its store does not read: "+err.Error()
			dir.Fix = "the executor refuses to start or apply on it; what the error says to do, after keeping a copy of " + c.state
		}
		if dir.Status == checkOK && readOnly(c.state) {
			dir.Status, dir.Detail = checkFail, dir.Detail+"; its filesystem is mounted read-only: the executor can record nothing there"
			dir.Fix = "mount it read-write (mount -o remount,rw on its mount point), once you know why it was not: errors remount a filesystem read-only"
		}
		id, idErr = identity.Load(c.state)
		pending, _ = enrol.ReadPending(c.state)
		rekey, _ = enrol.ReadRekey(c.state)
		link, linkErr = serve.ReadLinkState(c.state)
		faults, faultsErr = serve.ReadFaults(c.state)
	}
	checks := []check{
		dir,
		daemonCheck(c.state, c.socket),
		identityCheck(exists, id, idErr, pending, rekey, now),
		linkCheck(id != nil, link, linkErr, now),
		heldCheck(st, id),
		rescueCheck(exists, st, id),
		clockCheck(id != nil, link),
		diskCheck(c.state),
		initCheck(c.partial),
		faultsCheck(faults, faultsErr),
	}
	var b strings.Builder
	code := 0
	for _, ch := range checks {
		if ch.Status == checkFail {
			code = ExitFailed
		}
		b.WriteString(ch.line())
	}
	if p := c.print(checks, b.String()); p != 0 {
		return p
	}
	return code
}

// line is the check as doctor prints it: "STATUS  WHAT: detail", and the
// fix on the next line when there is one.
func (ch check) line() string {
	s := fmt.Sprintf("%-4s  %s: %s\n", ch.Status, ch.Check, ch.Detail)
	if ch.Fix != "" {
		s += "      fix: " + ch.Fix + "\n"
	}
	return s
}

// stateCheck looks at the state directory without creating it: it must be
// a directory of root's that nobody else may enter (mode 0700), as the
// store makes it.
func stateCheck(state string) (check, bool) {
	ch := check{Check: "state directory", Status: checkOK}
	info, err := fsx.Lstat(state)
	switch {
	case err != nil:
		ch.Status, ch.Detail = checkFail, err.Error()
		ch.Fix = "look at " + state + " and the directories above it: each must be a directory, not a link"
		return ch, false
	case info.Kind == fsx.Absent:
		ch.Detail = "none: " + state + " does not exist (hosted, not enrolled: nothing applied or enrolled here yet)"
		return ch, false
	case info.Kind != fsx.Dir:
		ch.Status, ch.Detail = checkFail, fmt.Sprintf("%s is a %s, not a directory", state, info.Kind)
		ch.Fix = "move it aside; the executor makes the directory at its next apply or start"
		return ch, false
	case info.UID != 0 || info.Mode&0o7777 != 0o700:
		ch.Status, ch.Detail = checkFail, fmt.Sprintf("%s is uid %d, mode %04o; it must be root's, mode 0700 (the executor refuses it otherwise)", state, info.UID, info.Mode&0o7777)
		ch.Fix = "chown root:root " + state + " && chmod 0700 " + state + ", once you know who changed it"
		return ch, true
	}
	ch.Detail = state + ", root's, mode 0700"
	return ch, true
}

// readOnly says whether dir's filesystem is mounted read-only.
func readOnly(dir string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Flags&unix.ST_RDONLY != 0
}

// daemonCheck says whether `mesh-executor serve` runs for state and
// answers on sock: the socket must exist and accept a connection from a
// process of root's, and the daemon holding state's lock (ServeLockFile,
// its pid written there) should be the one answering. The connection is
// closed at once, before any hello: the daemon takes it for a peer that
// went away, and says nothing of it.
func daemonCheck(state, sock string) check {
	ch := check{Check: "daemon", Status: checkFail}
	start := "start it through the init (systemctl start mesh-executor, rc-service mesh-executor start, sv up mesh-executor); its log says why it stopped"
	holder := serving(state) // the pid holding the lock open, not the lock's last
	fi, err := os.Lstat(sock)
	switch {
	case err != nil && holder > 0:
		serves := engine.RunningSocket(state)
		// Of this daemon only if written since it took its lock: one
		// that could not write it (a full disk), or has not yet (starting),
		// left the last run's.
		lockAt, lerr := os.Stat(filepath.Join(state, ServeLockFile))
		runAt, rerr := os.Stat(filepath.Join(state, engine.RunningFile))
		if lerr != nil || rerr != nil || runAt.ModTime().Before(lockAt.ModTime()) {
			serves = ""
		}
		if serves == sock {
			// Its own socket gone (removed by hand, a tmpfiles clean):
			// its agent cannot reach it.
			ch.Detail = fmt.Sprintf("mesh-executor serve (pid %d) holds %s and serves %s, which is gone: no agent reaches it", holder, state, sock)
			ch.Fix = "restart it through the init (systemctl restart mesh-executor, rc-service mesh-executor restart, sv restart mesh-executor): it makes its socket anew"
			return ch
		}
		// Running, told another socket than doctor was.
		ch.Status = checkWarn
		ch.Detail = fmt.Sprintf("mesh-executor serve (pid %d) holds %s, on another socket than %s", holder, state, sock)
		ch.Fix = fmt.Sprintf("run doctor with the --socket that daemon was started with (ps -o args -p %d)", holder)
		if serves != "" {
			ch.Detail += fmt.Sprintf(" (it serves %s)", serves)
			ch.Fix = "run doctor --socket " + serves
		}
		return ch
	case err != nil:
		ch.Detail, ch.Fix = noSocket(sock), start
		return ch
	case fi.Mode().Type() != os.ModeSocket:
		ch.Detail = sock + " is not a socket"
		ch.Fix = "move it aside and restart the executor: it makes its socket there"
		return ch
	}
	conn, err := net.DialTimeout("unix", sock, doctorDialWithin)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		ch.Detail, ch.Fix = sock+" is left from a daemon that is gone: nothing answers on it", start
		return ch
	case err != nil:
		ch.Detail, ch.Fix = fmt.Sprintf("%s does not answer: %v", sock, err), start
		return ch
	}
	peer, err := wire.PeerOf(conn)
	conn.Close()
	switch {
	case err != nil:
		ch.Detail = fmt.Sprintf("%s answers, but who answers cannot be told: %v", sock, err)
		return ch
	case peer.UID != 0:
		ch.Detail = fmt.Sprintf("%s is answered by uid %d (pid %d), not root: it is not the executor", sock, peer.UID, peer.PID)
		ch.Fix = "find what serves it (ls -l /proc/" + fmt.Sprint(peer.PID) + "/exe), stop it, and start the executor"
		return ch
	case int(peer.PID) != holder:
		ch.Status = checkWarn
		ch.Detail = fmt.Sprintf("%s answers (pid %d), but that daemon does not hold %s: it serves another --state", sock, peer.PID, state)
		ch.Fix = "run doctor with the --state and --socket the daemon was started with (ps -o args -p " + fmt.Sprint(peer.PID) + ")"
		return ch
	}
	ch.Status, ch.Detail = checkOK, fmt.Sprintf("running (pid %d), answers on %s", peer.PID, sock)
	return ch
}

// alive tells whether a process pid exists.
func alive(pid int) bool {
	return unix.Kill(pid, 0) == nil
}

// identityCheck says whom the node is: enrolled (its node, enrolment and
// the control key it pins), hosted, or an enrolment under way.
func identityCheck(exists bool, id *identity.Identity, err error, pending *enrol.PendingView, rekey *enrol.RekeyView, now time.Time) check {
	ch := check{Check: "identity", Status: checkOK}
	switch {
	case err != nil:
		ch.Status, ch.Detail = checkFail, err.Error()
		ch.Fix = "the daemon refuses this identity as well: enrol the node again (mesh-control token issue --node NAME, then mesh-executor enrol --replace)"
		return ch
	case id != nil:
		ch.Detail = fmt.Sprintf("enrolled: node %s (enrolment %s), control key %s pinned", id.Node, id.Enrolment, wire.KeyID(id.ControlKey))
	case !exists:
		ch.Detail = "hosted: not enrolled (no state)"
	default:
		ch.Detail = "hosted: not enrolled; the executor takes local files and the carried bundle only"
	}
	if p := pending; p != nil {
		ch.Detail += fmt.Sprintf("; an enrolment is pending (token %s, begun %s, expires %s)", p.Token, stamp(p.Begun), stamp(p.Expires))
		if p.Expired {
			ch.Status = checkWarn
			ch.Detail += ": its token has expired"
			ch.Fix = "mesh-executor enrol --cancel, then enrol again with a new token"
		} else {
			ch.Detail += ": mesh-executor status says how it goes"
		}
	}
	if r := rekey; r != nil {
		ch.Detail += fmt.Sprintf("; a rekey is asked for since %s, the control side's answer awaited (the agent carries the request with its heartbeats)", stamp(r.Begun))
		if now.Sub(r.Begun) > rekeyUnanswered && ch.Status == checkOK {
			ch.Status = checkWarn
			ch.Fix = "is the agent linked (the link line below)? a control side of a release before rekeys reads past the request; mesh-executor rekey --cancel ends it"
		}
	}
	return ch
}

// heldCheck says whether the link's last declaration is held against
// drift: the daemon reconciles only one addressed to the enrolment the
// machine holds, so one of the enrolment a re-enrolment replaced is not
// (the trust rule) until the control side declares to this one.
func heldCheck(st *store.Store, id *identity.Identity) check {
	ch := check{Check: "held", Status: checkOK}
	switch {
	case id == nil:
		ch.Detail = "none: a hosted node holds no link declaration"
	case st == nil:
		ch.Detail = "the store could not be read"
		ch.Status = checkWarn
	default:
		raw, _ := st.Target(store.Link)
		u := unheld(st, id)
		switch {
		case raw == nil:
			ch.Detail = "nothing declared over the link yet"
		case u != nil:
			ch.Status = checkWarn
			ch.Detail = fmt.Sprintf("the link's last declaration (seq %d) is addressed to node %s, enrolment %s, not this one: not reconciled, so a drift of what it made is not put back", u.Seq, u.Node, u.Enrolment)
			ch.Fix = fmt.Sprintf("declare to this enrolment: mesh-control declare %s FILE (serve declares a node enrolled again its last declaration itself, unless that held sealed content or retired it)", id.Node)
		default:
			ch.Detail = "the link's last declaration is this enrolment's, reconciled at each drift look"
		}
	}
	return ch
}

// rescueCheck says whether the rescue file last applied (the local
// source's target) is still held: reconciled at each drift look only
// while it is addressed to this node — one applied before the machine
// was enrolled, or enrolled again under another name, is refused at each
// look, and a drift of what it made is no longer put back.
func rescueCheck(exists bool, st *store.Store, id *identity.Identity) check {
	ch := check{Check: "rescue", Status: checkOK}
	if !exists {
		ch.Detail = "no rescue file applied (no state yet)"
		return ch
	}
	if st == nil {
		ch.Status, ch.Detail = checkWarn, "the store could not be read"
		return ch
	}
	raw, _ := st.Target(store.Local)
	if raw == nil {
		ch.Detail = "no rescue file applied"
		return ch
	}
	d, err := shapes.ParseTrusted(raw)
	if err != nil {
		ch.Status, ch.Detail = checkWarn, "the rescue file last applied does not read: "+err.Error()
		return ch
	}
	// The drift look's own rule: the node it holds the file to, and the
	// apply's check of it.
	if err := engine.CheckAddress(d, serve.ReconcileNodeID(store.Local, d, id)); err != nil {
		why := err.Error()
		if r := (*engine.Refusal)(nil); errors.As(err, &r) {
			why = r.Reason
		}
		ch.Status = checkWarn
		ch.Detail = fmt.Sprintf("the rescue file last applied is refused at each drift look (%s): not reconciled, so a drift of what it made is not put back", why)
		ch.Fix = fmt.Sprintf(`apply it again addressed to this node ("node": %q in the file; mesh-executor apply FILE), or a file for %s that declares nothing to let go of what it held`, id.Node, id.Node)
		return ch
	}
	ch.Detail = fmt.Sprintf("the rescue file last applied (%d resource(s)) is reconciled at each drift look", len(d.Resources))
	return ch
}

// rekeyUnanswered is how long a rekey may wait for the control side's
// answer before doctor says so: the answer comes with the next heartbeat
// of a linked agent.
const rekeyUnanswered = 10 * time.Minute

// linkCheck says the agent's link as it last told the executor: linked,
// disconnected or revoked since when, and whether the agent has gone
// silent (status's own words, linkLine).
func linkCheck(enrolled bool, l *serve.LinkState, err error, now time.Time) check {
	ch := check{Check: "link", Status: checkOK}
	switch {
	case err != nil:
		ch.Status, ch.Detail = checkWarn, fmt.Sprintf("what the agent last said cannot be read: %v", err)
		ch.Fix = "the daemon writes " + serve.LinkFile + " again within a minute of the agent's next word"
		return ch
	case !enrolled:
		ch.Detail = "none: a hosted node has no link"
		return ch
	case l == nil:
		ch.Status, ch.Detail = checkWarn, "the agent has never told the executor of its link"
		ch.Fix = "is mesh-agent running, as the executor's --agent-user? its log says why it has not reached the executor"
		return ch
	}
	ch.Detail = strings.TrimSuffix(strings.TrimPrefix(linkLine(l, now, ""), "link: "), "\n")
	switch {
	case !l.Up && !l.Revoked.IsZero():
		ch.Status = checkFail
		ch.Fix = "mesh-control token issue --node NAME, then mesh-executor enrol on this machine"
		// linkLine says the fix itself; once is enough.
		ch.Detail, _, _ = strings.Cut(ch.Detail, ": the broker refuses")
		ch.Detail += ": the broker refuses this node's credential"
	case !l.Up && l.LastError != "":
		ch.Status = checkWarn
		ch.Fix = "mend what the agent's last error names — the broker's address (broker_url in its configuration), the broker's certificate (the pinned fingerprint), a firewall between; the executor holds the machine as last declared meanwhile"
	case !l.Up:
		ch.Status = checkWarn
		ch.Fix = "the executor holds the machine as last declared meanwhile; the agent's log says why it cannot reach the broker (address, certificate, firewall)"
	case now.Sub(l.SaidAt) > linkSilentAfter:
		ch.Status = checkWarn
		ch.Fix = "start mesh-agent; its log says why it stopped"
	}
	return ch
}

// skewFixed is the clock's skew from which doctor asks for it to be
// set right: the control side's own threshold (mesh-control nodes shows
// a skew from a minute), past a heartbeat's time in flight.
const skewFixed = time.Minute

// clockCheck says the clock against the control side's — the broker's, as
// the agent last measured it over its link (its own newest heartbeat read
// back: the skew mesh-control nodes shows, measured alike) and told the
// executor (LinkFile): the executor dials nothing off the machine — and
// whether the kernel says something keeps it synchronized.
func clockCheck(enrolled bool, l *serve.LinkState) check {
	ch := check{Check: "clock", Status: checkOK}
	skew := time.Duration(0)
	switch {
	case !enrolled:
		ch.Detail = "not measured: a hosted node has no broker to measure against"
	case l == nil || l.ClockAt.IsZero():
		ch.Detail = "not measured yet: the agent measures it against the broker's with one of the first ten heartbeats of each link, drawn at random (a control side of an earlier release does not let it; mesh-control nodes shows a skew over a minute)"
	default:
		skew = time.Duration(l.ClockSkewMS) * time.Millisecond
		how := fmt.Sprintf("%s ahead of", skew)
		if skew < 0 {
			how = fmt.Sprintf("%s behind", -skew)
		}
		ch.Detail = fmt.Sprintf("%s the broker's (the control side's), as the agent measured at %s", how, stamp(l.ClockAt))
		if skew.Abs() >= skewFixed {
			ch.Status = checkWarn
			ch.Fix = "set this clock right and keep it synchronized (timedatectl set-ntp true, or chronyd or ntpd): while it is off, plan requests are refused for their time and the node's reports carry its wrong times"
		}
	}
	ch.Detail += "; this clock reads " + clock.Now().UTC().Format(time.RFC3339)
	var tx unix.Timex // Modes 0: read only
	if st, err := unix.Adjtimex(&tx); err == nil {
		if st == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0 {
			ch.Detail += ", not synchronized by the kernel's account"
		} else {
			ch.Detail += ", synchronized by the kernel's account"
		}
	}
	return ch
}

// diskCheck says the space left on the filesystem that holds the state
// directory (or would: its nearest existing parent).
func diskCheck(state string) check {
	ch := check{Check: "disk"}
	at := state
	var fs unix.Statfs_t
	for {
		err := unix.Statfs(at, &fs)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || at == filepath.Dir(at) {
			ch.Status, ch.Detail = checkWarn, fmt.Sprintf("statfs %s: %v", at, err)
			return ch
		}
		at = filepath.Dir(at)
	}
	avail, total := fs.Bavail*uint64(fs.Bsize), fs.Blocks*uint64(fs.Bsize)
	ch.Status = diskStatus(avail, total)
	pct := uint64(0)
	if total > 0 {
		pct = avail * 100 / total
	}
	where := "holding " + at
	if at != state {
		where = "where " + state + " would be made (" + at + ")"
	}
	ch.Detail = fmt.Sprintf("%s free of %s (%d%%) on the filesystem %s", size(avail), size(total), pct, where)
	switch ch.Status {
	case checkFail:
		ch.Fix = "free space now: an apply cannot record what it does, and refuses to start (df -h " + at + ")"
	case checkWarn:
		ch.Fix = "free space on it before the store runs out (df -h " + at + ")"
	}
	return ch
}

// diskStatus judges free space: fail under 1 MiB, warn under 64 MiB or
// under a tenth of the filesystem.
func diskStatus(avail, total uint64) string {
	switch {
	case avail < diskFailBytes:
		return checkFail
	case avail < diskWarnBytes || avail*100 < total*diskWarnFraction:
		return checkWarn
	}
	return checkOK
}

// size says n bytes in the largest unit that keeps it above 1.
func size(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// initCheck names the init the executor drives, by its own detection.
func initCheck(partial bool) check {
	ch := check{Check: "init", Status: checkOK}
	ctx, cancel := context.WithTimeout(context.Background(), doctorInitWithin)
	defer cancel()
	m, err := initsys.Detect(ctx)
	switch {
	case err == nil:
		ch.Detail = m.Name()
		m.Close()
	case partial:
		ch.Detail = "none: a partial host drives no init (file, directory, region, keys, action and archive only)"
	default:
		ch.Status, ch.Detail = checkWarn, err.Error()
		ch.Fix = "a service or package declared to this node fails; declare to such a node what needs no init (file, directory, region, keys, archive; an action in a rescue file), or run it under systemd, OpenRC, runit or s6"
	}
	return ch
}

// faultsCheck says the panics the daemon recovered from (faults.json).
func faultsCheck(f serve.Faults, err error) check {
	ch := check{Check: "faults", Status: checkOK}
	switch {
	case err != nil:
		ch.Status, ch.Detail = checkWarn, err.Error()
	case f.Recovered == 0:
		ch.Detail = "none recorded"
	default:
		ch.Status = checkWarn
		ch.Detail = fmt.Sprintf("%d internal errors recovered (the daemon went on); the newest at %s serving %s: %s", f.Recovered, stamp(f.LastAt), f.LastIn, f.LastPanic)
		ch.Fix = "the daemon's log has its stack (journalctl -u mesh-executor); report it with the version (mesh-executor version)"
	}
	return ch
}

func stamp(t time.Time) string { return t.Local().Format(time.RFC3339) }
