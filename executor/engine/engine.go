// Package engine makes the machine match a declaration: validate whole
// first, save the target, apply in stated order (observe, change, read
// back), record after it works, remove what this source applied earlier and
// no longer declares, and report a line per resource with the outcome
// derived from the worst line.
//
// Durability without a sync per file: consecutive file and directory steps
// are observed first, then their intents are written and made durable with
// one sync of the state's filesystem, then the changes are made and read
// back, then the filesystems they touched are synced once, and only then
// are the entries recorded as applied. A crash anywhere leaves at worst an
// intent without its outcome, which the next apply settles by looking at
// the machine. An action runs alone, with its intent durable before it
// starts, because what it does is not ours to see.
//
// File and directory steps are batched here; every other shape runs
// alone and registers itself (registerAlone) from its own file: action,
// service, package, user, archive, overlay, opening, container, network.
// A shape with no applier, or whose applier finds nothing to drive here
// (readyFor), is refused by name before anything is touched.
package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Options say where a declaration came from and how to treat it.
type Options struct {
	Source store.Source
	// NodeID is this node's id once enrolled; "" on a hosted machine, where
	// a local file has nothing to be checked against.
	NodeID string
	// OnDiff, in a plan, is given the content diff of each file whose
	// content would change (capped; sealed content never shown). For the
	// person at the terminal: no report carries it.
	OnDiff func(module, id, diff string)
	// Plan observes only: nothing on the machine or in the store changes.
	Plan bool
	// Partial is a host that may drive no init, package manager or runtime
	// (Android): file, directory, region, keys, action and archive only.
	Partial bool
	Log     *slog.Logger
	// OnLine, when set, is given each report line as it is decided, so a
	// daemon can stream them to the agent while the apply goes on.
	OnLine func(shapes.Line)
	// Init connects to the machine's init, when a service is declared or
	// must be given back; nil means initsys.Detect.
	Init func() (initsys.Manager, error)
	// Unseal opens sealed file content; the engine holds no key of its
	// own. nil on a host with no sealing key (hosted, or a node registered
	// by hand), where a declaration with sealed content is refused whole.
	Unseal *Unsealer
	// Accepted, when set, is called once the declaration has passed every
	// check and been saved as the target, before anything on the machine
	// changes; an error refuses it. The daemon records the link's sequence
	// floor here, so a declaration refused for a passing reason (a name
	// service down, a full disk) can be delivered again.
	Accepted func() error
	// HostBinary is where the host's package installs the executor
	// (DefaultHostBinary when ""), and HostVersion the running one's
	// version: an upgrade is checked and noticed with them.
	HostBinary  string
	HostVersion string
	// AgentUser is the agent's user (DefaultAgentUser when ""): an
	// upgrade's new agent, installed beside HostBinary, is run once as
	// root with --self-check, dropping itself to this user, before the
	// host commits to the release.
	AgentUser string
	// Roster is the mesh's roster this host holds, verified: the peers of
	// an overlay declared with "roster": true (every node in it but this
	// one). nil: it holds none, and such an overlay fails.
	Roster *shapes.Roster
	// FailedHostRelease is the host's package version the launcher rolled
	// back from (it crash-looped at start): never installed again until a
	// declaration names another version or a person clears it.
	FailedHostRelease string
	// FailedHostReason is why the launcher rolled it back.
	FailedHostReason string
	// Restore says the machine may have lost what lives only in the
	// kernel — a boot (the daemon's start), the host's firewall loaded
	// again: what the store records of the firewall and the overlay is put
	// back even when a step before them fails (putBackLost).
	Restore bool
	// Keep, when set, is called once an apply that was not refused (nor a
	// plan) has made its report, before the journal says the apply ended:
	// it makes the report durable where its reader finds it (the history,
	// the lines kept for a report sent again). Once the end is durable
	// the next apply no longer says what this one changed (store.Begin),
	// and the end may reach the disk at once (a compaction), so a cut
	// between the two would leave the changes said nowhere. Lines added
	// after it (a compaction that failed) are in the report returned.
	Keep func(*shapes.Report)
	// Stop, once closed, ends the apply before its next resource: the
	// daemon is asked to stop. The step in progress runs to its end — a
	// package manager or an action cut off midway leaves the machine as
	// nobody declared it, and a stop is not a reason to — and the rest is
	// said not attempted, for the next start's reconcile to apply. Nothing
	// undeclared is removed by an apply that stopped (it did not see the
	// whole declaration through). nil: never.
	Stop <-chan struct{}

	// accounts and packages replace the shadow tools and the package
	// manager in tests.
	accounts accounts
	packages packageManager
	// getent replaces the name service's (getent) in tests.
	getent func(db, key string) ([]string, error)
	// repositoryPaths replace the machine's (repositoryPaths) in tests.
	repositoryPaths []string
	// beforeChange, in tests, is what else happens on the machine between
	// a step's look and its change (another applier, a person).
	beforeChange func(target string)
}

// batchLimit bounds how many steps share one durable intent group.
const batchLimit = 512

// Applied is the set of shapes this executor can apply today.
// (file and directory here; the others add themselves with registerAlone.)
var Applied = map[string]bool{shapes.TypeFile: true, shapes.TypeDirectory: true}

// partialShapes are what a partial host can ever apply.
var partialShapes = map[string]bool{shapes.TypeFile: true, shapes.TypeDirectory: true, shapes.TypeAction: true, shapes.TypeArchive: true,
	shapes.TypeRegion: true, shapes.TypeKeys: true}

// Refusal is a declaration refused whole, before anything was touched.
type Refusal struct{ Reason string }

func (r *Refusal) Error() string { return "executor: refused: " + r.Reason }

type run struct {
	ctx    context.Context
	st     *store.Store
	opt    Options
	d      *shapes.Declaration
	owners map[string]owner // by resource key
	taken  map[string]bool
	log    *slog.Logger
	lines  []shapes.Line
	devs   map[uint64]string // filesystems touched, one directory on each
	// touchedDirs are the directories touch has looked at since the last sync.
	touchedDirs map[string]bool
	stopped     bool
	// The init, when a service is declared or given back.
	init     initsys.Manager
	units    map[string]string // service key -> the unit's canonical name
	restarts []pendingRestart  // services with restart_on, decided last
	// owed is the restarts an apply of this source before owed (its
	// restart_on named a file it changed, and it stopped or failed
	// before the restart), by unit; owedNow, what this apply leaves owed.
	owed, owedNow map[string][]string
	// cutChanged is the "module.id" of the changes an apply of this
	// source cut short (a kill, a power cut) had said: the restarts they
	// call for are owed (owes).
	cutChanged map[string]bool
	// cutVersion is, by archive target, the version an unpack a cut
	// stopped was writing when its record names the one before (settle).
	cutVersion map[string]string
	changed    map[string]bool // "module.id" of lines applied or repaired
	// repoFiles are the files of this declaration that configure a
	// package manager's repositories (by "module.id"); repoDirty: one of
	// them changed since the index was last refreshed; refreshed: the
	// index was refreshed in this apply (refreshFor).
	repoFiles            map[string]bool
	repoDirty, refreshed bool
	// declaredDirs are the directories declared so far, in stated order.
	declaredDirs map[string]bool
	// forget are kept originals no entry needs once the apply's records
	// are durable.
	forget []string
	// unitDirty: a unit file changed since the init last read them.
	unitDirty bool
	// unitFiles are units a file of this declaration defines.
	unitFiles map[string]bool
	// unitComing: services whose unit the init did not know when the
	// declaration was checked, to come with a unit file or a package
	// declared before it (whether that makes its found state "absent" is
	// the service step's to say: foundAbsent); unitGone: services the host
	// applied before whose unit is gone now (removed by hand). By resource
	// key.
	unitComing, unitGone map[string]bool
	// removing: the paths removeUndeclared has decided to remove so far,
	// newest first, so a directory's decision counts what goes before it.
	removing map[string]bool
	// shipped: the files and directories the host created that a package
	// ships now, by path (shippedBy; nil until asked).
	shipped map[string]string
	// leftovers: what interrupted writes left that a plan's settle found,
	// which the apply's removes (a directory holding one is empty then).
	leftovers map[string]bool
	// declaredKids: the names each directory will hold of what this
	// declaration declares (leftIn), made when first needed.
	declaredKids map[string][]string
	// heldOK says, for each resource held on an adopted node, whether what
	// was found is what is declared (ok) or differs (kept).
	heldOK map[string]bool
	// upgradedTo: the host's package now installs another version than the
	// one running (checked to run): the daemon restarts onto it.
	upgradedTo string
	// declared is each resource's claim and the target it manages now: a
	// resource that moves to another path leaves its old one undeclared.
	declared map[claimTarget]bool
	// declaredTargets: what declares each target of declared, made when
	// first needed, once every step has declared its own (declaredBy).
	declaredTargets map[string]string
	// claimTypes: the type of each resource of the declaration, by its
	// claim, made when first needed (typeOf).
	claimTypes map[store.Claim]string
	// edits: the claims on keys and regions recorded in the store, of any
	// source, by the file they edit, made when first needed (editsAt).
	edits map[string][]store.Claim
	// unpackedBy: the claims of the archives that wrote each path, of any
	// source, made when first needed (archivedAt).
	unpackedBy map[string][]store.Claim
	// unsealed is each sealed file's content, opened by check before
	// anything is touched ("module.id" → plaintext). It never leaves the
	// run: not in a line, a log, an error or the store.
	unsealed map[string][]byte
	// ownerComing: the owner ("user[:group]") of each file or directory
	// whose user a user resource declared before it makes, by key:
	// resolved at its step (wantAttrs).
	ownerComing map[string]string
	// keysAt is what the keys records say, read at the first keys step
	// (keysHere).
	keysAt *keysHere
	// early: the targets removeReshaped undid before the apply;
	// plannedFile, in a plan, what each of their files would hold after
	// (nil: gone), for the step that edits it.
	early       map[string]bool
	plannedFile map[string][]byte
	// plannedGone, in a plan: the targets an early removal drops from the
	// store (removeFirst).
	plannedGone map[string]bool
	// planBrings, in a plan: a package planned before would be installed,
	// and may bring a file a region or keys edits.
	planBrings bool
	// unpacked, in a plan: what each archive planned before would write
	// (a plan unpacks nothing), by path: a later step that edits one of
	// its files, or a directory removal that counts what it holds, reads
	// it here as the apply finds it on the machine.
	unpacked map[string]*archiveEntry
	// archiveWrote: the files an archive of this run writes anew (a new
	// version) that keys or a region edit: what they hold then is what
	// the edit finds, to give back (keys), not the version before's.
	archiveWrote map[string]bool
	// archiveMadeDir: the directories an archive of this run made (a
	// directory resource after it finds one there: the host's making,
	// not a directory found).
	archiveMadeDir map[string]bool
	// plannedFiles, in a plan: the files a file resource planned before
	// writes (a plan writes none), for a later archive's look.
	plannedFiles map[string]bool
	// plannedOwner, in a plan: the owner a directory resource planned
	// before gives the directory it makes or sets.
	plannedOwner map[string][2]uint32
	// filePaths: each path a file resource of this declaration declares,
	// and which (fileDeclared), made when first needed.
	filePaths map[string]string
	// dirPaths: the same of its directory resources (declaredPaths).
	dirPaths map[string]string
	// resumed: the resources ("source:module.id type") whose change an
	// earlier apply of this same declaration began and never recorded, cut
	// short (a power cut, a kill): one found done now was made by it, and
	// no report said so (final). interrupted: the begin records of such
	// applies, whose intents alone are taken as theirs. A change that
	// failed, or one begun for another declaration, says nothing of what
	// is found now: the machine may be as this one declares because that
	// change never happened.
	resumed     map[string]bool
	interrupted []uint64
	// resumedUndo: the same of a removal ("remove") or a give-back
	// ("restore") such an apply began.
	resumedUndo map[string]string
	// settled: by target, what settle made of an entry whose intent a
	// kill cut, until a new intent replaces that one (intend).
	settled map[string]*store.Entry
	// replaced: by target, the cut intent a new one replaced (intend),
	// given back if the new one is abandoned.
	replaced map[string]store.Intent
	// begun: the journal says this apply began (store.Begin), so it may
	// say it ended.
	begun bool
	// ran: the steps begun (applied, held or failed; a batch's, planned),
	// by claim and target; a stop leaves the rest out (putBackLost).
	ran map[claimTarget]bool
}

// Apply applies d, whose exact bytes are raw, with st locked. It returns the
// report; a refusal is a report with Refused set and no lines.
func Apply(ctx context.Context, st *store.Store, d *shapes.Declaration, raw []byte, opt Options) *shapes.Report {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	rep := &shapes.Report{Source: string(opt.Source), Seq: d.Seq, Lines: []shapes.Line{}}
	r := &run{ctx: ctx, st: st, opt: opt, d: d, log: opt.Log, taken: map[string]bool{}, devs: map[uint64]string{}, touchedDirs: map[string]bool{},
		units: map[string]string{}, changed: map[string]bool{}, declaredDirs: map[string]bool{}, declared: make(map[claimTarget]bool, len(d.Resources)), heldOK: map[string]bool{}, unitFiles: map[string]bool{}, unitComing: map[string]bool{}, unitGone: map[string]bool{},
		unsealed: map[string][]byte{}, lines: make([]shapes.Line, 0, len(d.Resources)), early: map[string]bool{}, plannedFile: map[string][]byte{}, plannedGone: map[string]bool{}, unpacked: map[string]*archiveEntry{}, plannedFiles: map[string]bool{}, plannedOwner: map[string][2]uint32{}, archiveWrote: map[string]bool{}, archiveMadeDir: map[string]bool{}, ran: map[claimTarget]bool{}, resumed: map[string]bool{}, resumedUndo: map[string]string{}, settled: map[string]*store.Entry{}, replaced: map[string]store.Intent{}, cutVersion: map[string]string{}}
	defer func() {
		if r.init != nil {
			r.init.Close()
		}
	}()
	for _, m := range d.Taken {
		r.taken[m] = true
	}
	protectSelf(st.Dir())
	// The same declaration applied before and cut short: a change it
	// began and never recorded, found done now, it made (run.resumed).
	began := store.Began{Source: opt.Source, Seq: d.Seq, Digest: digest(raw)}
	r.interrupted = st.Interrupted(began)
	if err := r.check(); err != nil {
		rep.Outcome, rep.Refused = shapes.Refused, err.Error()
		return rep
	}
	if !opt.Plan {
		// A program an executor before this one started and left running
		// (killed, it could not wait for it) is waited for before this
		// apply starts one beside it (command.LeftRunning), and what this
		// one starts is noted for the next.
		running := filepath.Join(st.Dir(), RunningDir)
		r.ctx = command.Tracked(ctx, running)
		if err := command.LeftRunning(running, opt.Stop, r.log.Warn); err != nil {
			rep.Outcome, rep.Refused, rep.Passing = shapes.Refused, "executor: "+err.Error()+" while waiting for a program an executor before this one left running; nothing was changed", true
			return rep
		}
		if r.stopAsked() {
			rep.Outcome, rep.Refused, rep.Passing = shapes.Refused, "executor: asked to stop before the apply began; nothing was changed", true
			return rep
		}
		if err := st.SaveTarget(opt.Source, raw); err != nil {
			rep.Outcome, rep.Refused, rep.Passing = shapes.Refused, "executor: cannot save the target: "+err.Error(), true
			return rep
		}
		if opt.Accepted != nil {
			// The target on the disk before the caller's floor names it
			// (the floor is synced as it moves): a power cut after the
			// floor moved must find the declaration the start's reconcile
			// resumes, not the one before or an empty file.
			if err := st.Sync(); err != nil {
				rep.Outcome, rep.Refused, rep.Passing = shapes.Refused, "executor: cannot save the target: "+err.Error(), true
				return rep
			}
			if err := opt.Accepted(); err != nil {
				rep.Outcome, rep.Refused, rep.Passing = shapes.Refused, "executor: "+err.Error(), true
				return rep
			}
		}
		// What this apply says of its changes goes into the journal with
		// them (store.Begin): a cut before its report is sent leaves them
		// said all the same, by the next apply. Not begun (a full disk),
		// the apply goes on; only that record is missing.
		noted, err := st.Begin(began)
		r.begun = err == nil || errors.Is(err, store.ErrNotNoted)
		// Said once an apply: the journal notes what it said in parts.
		type cut struct {
			source string
			seq    uint64
		}
		var order []cut
		sums := map[cut][2]int{}
		for _, a := range noted {
			k := cut{string(a.Source), a.Seq}
			if _, ok := sums[k]; !ok {
				order = append(order, k)
			}
			n := sums[k]
			sums[k] = [2]int{n[0] + a.Changed, n[1] + a.Failed}
		}
		for _, k := range order {
			r.log.Warn("an apply cut short (a power cut, a kill) had changed the machine before its report went out: noted for the control side",
				"source", k.source, "seq", k.seq, "changed", sums[k][0], "failed", sums[k][1])
		}
		switch {
		case errors.Is(err, store.ErrNotNoted):
			r.log.Warn("what the applies cut short before this one changed could not be kept for the restarts it owes: they stay in the journal for the next apply", "err", err)
		case err != nil:
			r.log.Warn("the journal could not say an apply begins", "err", err)
		}
	}
	r.owed = st.RestartsOwed(opt.Source)
	r.cutChanged = st.CutChanged(opt.Source, opt.Plan)
	r.owedNow = maps.Clone(r.owed)
	if r.owedNow == nil {
		r.owedNow = map[string][]string{}
	}
	r.removeReshaped()
	if !r.stopped {
		r.applyAll()
	}
	r.reloadUnits()
	if !r.stopped {
		r.removeUndeclared()
	}
	r.putBackLost()
	r.reloadUnits()
	// The restarts come last, after the removals: a unit restarted
	// before its drop-in (or any file it reads) was removed would run on
	// what the declaration no longer holds.
	r.restartOn()
	r.keepOwed()
	if !opt.Plan {
		if opt.Keep != nil {
			rep.Lines, rep.Outcome = r.lines, shapes.Derive(r.lines)
			opt.Keep(rep)
		}
		// Ended only if begun: an end pops the apply begun last, which
		// would otherwise be one cut short before, never noted.
		if r.begun {
			if err := st.End(); err != nil {
				r.log.Warn("the journal could not say the apply ended", "err", err)
			}
		}
		if err := st.Commit(); err != nil {
			r.emit(shapes.Line{Type: "store", Outcome: shapes.Failed, Detail: err.Error()})
		}
		// Kept originals given back are deleted only once the records that
		// no longer need them are durable.
		if len(r.forget) > 0 && st.Sync() == nil {
			for _, d := range r.forget {
				st.ForgetOriginal(d)
			}
		}
	}
	rep.Lines = r.lines
	rep.Outcome = shapes.Derive(rep.Lines)
	if rep.Outcome != shapes.Failed {
		rep.Upgraded = r.upgradedTo
	}
	if d.Adopted {
		rep.Briefing = r.briefing(rep, r.observeRest())
		if !opt.Plan {
			if err := st.SaveBriefing(rep.Briefing); err != nil {
				r.log.Warn("the briefing could not be kept", "err", err)
			}
		}
	}
	return rep
}

// CheckAddress refuses d where nodeID (Options.NodeID: "" checks no node)
// is not the node it is addressed to: the apply's first check, and what
// doctor says of the rescue file the drift look applies again.
func CheckAddress(d *shapes.Declaration, nodeID string) error {
	if nodeID != "" && d.Node == "" {
		return &Refusal{fmt.Sprintf(`the declaration names no node, and this machine is enrolled as node %q: a local file names the node it is for ("node": %q)`, nodeID, nodeID)}
	}
	if nodeID != "" && d.Node != nodeID {
		return &Refusal{fmt.Sprintf("the declaration is addressed to node %q; this is node %q", d.Node, nodeID)}
	}
	return nil
}

// check is everything that can refuse the declaration before anything is
// touched: address, shapes this host can apply, sealed content, the
// protected set through the machine's symlinks, and owners.
func (r *run) check() error {
	d := r.d
	if d.Retire && r.opt.Source != store.Link {
		return &Refusal{"retire comes only signed by the control plane, over the link; a local file cannot drop the node's identity"}
	}
	if err := CheckAddress(d, r.opt.NodeID); err != nil {
		return err
	}
	for _, res := range d.Resources {
		h := res.Head()
		if r.opt.Partial && !partialShapes[h.Type] {
			return &Refusal{fmt.Sprintf("resource %s: a partial host applies only file, directory, region, keys, action and archive, not %q", h.Key(), h.Type)}
		}
		if !Applied[h.Type] {
			return &Refusal{fmt.Sprintf("resource %s: this host cannot apply %q yet", h.Key(), h.Type)}
		}
		if ready := readyFor[h.Type]; ready != nil {
			if err := ready(r); err != nil {
				return &Refusal{fmt.Sprintf("resource %s: %v", h.Key(), err)}
			}
		}
		// Every sealed content is opened now, so one that does not open
		// refuses the declaration before anything is touched: never half
		// an apply for want of a key.
		if f, ok := res.(*shapes.File); ok && f.Sealed != nil {
			if err := r.unseal(f); err != nil {
				return &Refusal{err.Error()}
			}
		}
	}
	if err := shapes.CheckProtected(d, fsx.Resolver()); err != nil {
		return &Refusal{err.Error()}
	}
	if err := r.checkReshaped(); err != nil {
		return err
	}
	// Units a file of this declaration defines: the init cannot know them
	// before that file is written.
	for _, res := range d.Resources {
		if f, ok := res.(*shapes.File); ok && isUnitPath(f.Path) {
			r.unitFiles[path.Base(f.Path)] = true
		}
		if f, ok := res.(*shapes.File); ok && r.repositoryFile(f.Path) {
			if r.repoFiles == nil {
				r.repoFiles = map[string]bool{}
			}
			r.repoFiles[f.Module+"."+f.ID] = true
		}
	}
	// Units: the init resolves aliases, and an alias of the host's own
	// unit is refused like its name.
	packageBefore := false
	for _, res := range d.Resources {
		if _, ok := res.(*shapes.Package); ok {
			packageBefore = true
		}
		svc, ok := res.(*shapes.Service)
		if !ok {
			continue
		}
		if err := r.connectInit(); err != nil {
			return &Refusal{fmt.Sprintf("resource %s: %v", svc.Key(), err)}
		}
		norm := shapes.NormaliseUnit(svc.Unit)
		cur, err := r.init.State(r.ctx, norm)
		if err != nil {
			return &Refusal{fmt.Sprintf("resource %s: %v", svc.Key(), err)}
		}
		if !cur.Known {
			switch {
			case r.unitFiles[norm] || packageBefore:
				// Defined by a file declared here, or brought by a
				// package declared before it: resolved once they are
				// applied. Not yet "absent" for that: a package declared
				// before may not be the one that brings it, or one the
				// host installed (foundAbsent decides, by who owns the
				// unit's file).
				r.units[svc.Key()], r.unitComing[svc.Key()] = norm, true
				continue
			case r.st.Get("service:"+norm) != nil || r.st.Get("service:"+strings.TrimSuffix(norm, ".service")) != nil:
				// Applied before, and removed by hand since: that line
				// fails, the rest of the declaration applies. Its record
				// is under the name the init gave it (bare on OpenRC,
				// runit and s6).
				name := norm
				if r.st.Get("service:"+name) == nil {
					name = strings.TrimSuffix(norm, ".service")
				}
				r.units[svc.Key()], r.unitGone[svc.Key()] = name, true
				continue
			}
			return &Refusal{fmt.Sprintf("resource %s field unit: %s knows no unit %q (a service never installs one; declare its unit file or its package before it)", svc.Key(), r.init.Name(), svc.Unit)}
		}
		if shapes.ProtectedUnit(cur.Name) {
			return &Refusal{fmt.Sprintf("resource %s field unit: %q is %s, the host's own unit: %v", svc.Key(), svc.Unit, cur.Name, shapes.ErrProtected)}
		}
		for other, name := range r.units {
			if name == cur.Name {
				return &Refusal{fmt.Sprintf("resource %s field unit: %q is %s, which %s declares too; one unit has one declaration", svc.Key(), svc.Unit, cur.Name, other)}
			}
		}
		r.units[svc.Key()] = cur.Name
	}
	if err := r.checkProcesses(); err != nil {
		return err
	}
	if err := r.checkParents(); err != nil {
		return err
	}
	o := newOwners(r.opt.getent)
	r.owners, r.ownerComing = map[string]owner{}, map[string]string{}
	users := map[string]bool{} // users declared so far, in stated order
	for _, res := range d.Resources {
		var spec string
		switch x := res.(type) {
		case *shapes.User:
			users[x.Name] = true
		case *shapes.File:
			spec = x.Owner
		case *shapes.Directory:
			spec = x.Owner
		}
		if spec == "" {
			continue
		}
		ow, err := o.resolve(spec)
		if name, _, _ := strings.Cut(spec, ":"); err != nil && users[name] {
			// Its user comes with a user resource declared before it
			// (a service account and its directory, in one declaration):
			// resolved when its step runs, after the user's.
			r.ownerComing[res.Head().Key()] = spec
			continue
		}
		if err != nil {
			return &Refusal{fmt.Sprintf("resource %s field owner: %v", res.Head().Key(), err)}
		}
		r.owners[res.Head().Key()] = ow
	}
	return nil
}

// aloneAppliers are the shapes whose steps run alone rather than in a
// batch of file and directory steps: what they do is not ours to batch.
// Each applier's file registers itself (registerAlone); the engine's own
// loop names none of them.
var aloneAppliers = map[string]func(r *run, st *step, rest int){}

// removers undo, by docs/declaration.md's table, an entry of a shape registered
// with registerAlone; nil means forgotten with the applier's own words.
var removers = map[string]func(r *run, st *step){}

// registerAlone registers the applier of a shape, and what undeclaring
// does; it panics on a shape registered twice.
func registerAlone(shape string, apply func(r *run, st *step, rest int), remove func(r *run, st *step)) {
	if _, dup := aloneAppliers[shape]; dup {
		panic("engine: " + shape + " registered twice")
	}
	aloneAppliers[shape] = apply
	removers[shape] = remove
	Applied[shape] = true
}

// unitDirs are where systemd reads unit files.
var unitDirs = []string{"/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system", "/usr/local/lib/systemd/system"}

// isUnitPath reports whether p is a unit file, or in a drop-in or wants
// directory, that systemd reads.
func isUnitPath(p string) bool {
	for _, d := range unitDirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// reloadUnits makes the init read its unit files again when the host
// changed one, before it is asked about a unit. Outside a plan only.
func (r *run) reloadUnits() {
	if !r.unitDirty || r.opt.Plan {
		return
	}
	if err := r.connectInit(); err != nil {
		return // no init to tell: nothing reads the unit files here
	}
	if err := r.init.Reload(r.ctx); err != nil {
		r.log.Warn("the init could not reload its unit files", "err", err)
		return
	}
	r.unitDirty = false
}

// connectInit connects to the machine's init once per apply.
func (r *run) connectInit() error {
	if r.init != nil {
		return nil
	}
	connect := r.opt.Init
	if connect == nil {
		connect = func() (initsys.Manager, error) { return initsys.Detect(r.ctx) }
	}
	m, err := connect()
	if err != nil {
		return err
	}
	r.init = m
	return nil
}

// step is one resource on its way through the engine.
type step struct {
	res    shapes.Resource
	claim  store.Claim
	target string
	entry  *store.Entry // what the store holds for target, settled
	line   shapes.Line
	// Set by planning when the machine must change.
	intent *store.Intent
	change func() error
	// readback observes again after change and returns the entry to record.
	readback func() (*store.Entry, error)
	// record is an entry to record with no change to the machine (a found
	// thing now held, an interrupted intent settled).
	record *store.Entry
	// drop: once done, the store forgets the target.
	drop bool
	// rewrites is the edit a region's or keys' removal makes to its file:
	// run on the file as it is when the change runs (rewriteNow), and, in
	// a plan, on what an earlier removal of the same apply would leave
	// (removeReshaped tells the file's next step).
	rewrites func(data []byte) ([]byte, error)
	// restoring: run by putBackLost, after the apply stopped, to bring
	// back exactly what the store records and nothing the declaration
	// changes beyond it (restore.go).
	restoring bool
	// creates: the change makes what its look found absent, exclusively
	// (a mkdir, a file put only where none is): EEXIST from it says the
	// host made nothing there.
	creates bool
}

func (r *run) claimOf(res shapes.Resource) store.Claim {
	h := res.Head()
	return store.Claim{Source: r.opt.Source, Module: h.Module, ID: h.ID}
}

func targetOf(c store.Claim, res shapes.Resource) string {
	if t := shapes.Target(res); t != "" {
		return t
	}
	return "action:" + c.Key()
}

// applyAll walks the resources in stated order, grouping consecutive file and
// directory steps into batches that share their syncs.
func (r *run) applyAll() {
	var batch []*step
	for i, res := range r.d.Resources {
		if r.stopped {
			return
		}
		if r.stopAsked() {
			// What is batched (files and directories) goes through
			// flush, which plans it and stops before its first change
			// (execute), saying how many steps it leaves: the lines
			// keep their order, and what was not made is said once.
			r.flush(batch, len(r.d.Resources)-i)
			if !r.stopped {
				r.stopBefore(countWord(len(r.d.Resources)-i, "later resource", "later resources"))
			}
			return
		}
		st := &step{res: res, claim: r.claimOf(res)}
		st.target = targetOf(st.claim, res)
		if svc, ok := res.(*shapes.Service); ok {
			st.target = "service:" + r.units[svc.Key()]
		}
		r.declare(st)
		st.line = shapes.Line{Module: res.Head().Module, ID: res.Head().ID, Type: res.Head().Type}
		switch res.(type) {
		default:
			fn, alone := aloneAppliers[res.Head().Type]
			if !alone {
				break
			}
			// Alone: what they do is not ours to batch.
			r.flush(batch, len(r.d.Resources)-i)
			batch = nil
			if r.stopped {
				return
			}
			if r.stopAsked() {
				r.stopBefore(countWord(len(r.d.Resources)-i, "later resource", "later resources"))
				return
			}
			r.ran[claimTarget{st.claim, st.target}] = true
			fn(r, st, len(r.d.Resources)-i-1)
			continue
		}
		batch = append(batch, st)
		if len(batch) == batchLimit {
			r.flush(batch, len(r.d.Resources)-i-1)
			batch = nil
		}
	}
	r.flush(batch, 0)
}

// stopAsked says whether the daemon was asked to stop (Options.Stop).
func (r *run) stopAsked() bool {
	select {
	case <-r.opt.Stop:
		return true
	default:
		return false
	}
}

// stopBefore ends the apply where it is, rest (counted, with its noun)
// not attempted.
func (r *run) stopBefore(rest string) {
	r.emit(shapes.Line{Type: "executor", Outcome: shapes.Failed,
		Detail: fmt.Sprintf("asked to stop: the apply stopped here (%s not attempted; the next apply of this declaration does them)", rest)})
	r.stopped = true
}

// RunningDir is the state's directory of the programs an apply started
// that are running (command.Tracked): those a killed executor left are
// waited for by the next apply.
const RunningDir = "running"

// flush plans, then carries out, a batch of file and directory steps. after
// is how many resources follow the batch, for the message of a failure.
func (r *run) flush(batch []*step, after int) {
	if len(batch) == 0 || r.stopped {
		return
	}
	for _, st := range batch {
		r.ran[claimTarget{st.claim, st.target}] = true
		st.entry = r.settle(r.st.Get(st.target), st.claim)
		if r.plannedGone[st.target] {
			st.entry = nil // a plan: an earlier removal drops it
		}
		if r.yields(st, st.entry) {
			continue
		}
		var err error
		switch res := st.res.(type) {
		case *shapes.File:
			err = r.planFile(st, res)
		case *shapes.Directory:
			err = r.planDirectory(st, res)
			r.declaredDirs[res.Path] = true
		}
		if err != nil {
			st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
			st.change, st.intent, st.record = nil, nil, nil
			break
		}
	}
	r.execute(batch, after)
}

// execute carries out planned steps: intents made durable, changes made and
// read back, the touched filesystems synced, and only then the outcomes
// recorded. In a plan it only reports.
func (r *run) execute(batch []*step, after int) {
	if len(batch) == 0 {
		return
	}
	if r.opt.Plan {
		for i, st := range batch {
			if st.line.Outcome == shapes.Failed {
				r.fail(st, nil, len(batch)-i-1+after)
				return
			}
			r.emit(st.line)
		}
		return
	}
	// Intents first, durable before the first change.
	for _, st := range batch {
		if st.line.Outcome == shapes.Failed {
			break
		}
		if st.intent != nil {
			if err := r.intend(st.target, *st.intent); err != nil {
				r.fail(st, err, 0)
				return
			}
		}
	}
	if err := r.st.Sync(); err != nil {
		r.fail(batch[0], err, 0)
		return
	}
	var done []*step
	failedAt, stoppedAt := -1, -1
	for i, st := range batch {
		if st.line.Outcome == shapes.Failed {
			failedAt = i
			break
		}
		if st.change != nil && r.stopAsked() {
			// Asked to stop: what was changed is recorded, the rest
			// not begun (a removal of packages, units, users one by
			// one is the longest part of some applies).
			stoppedAt = i
			break
		}
		if st.change != nil {
			if r.opt.beforeChange != nil {
				r.opt.beforeChange(st.target)
			}
			if err := st.change(); err != nil {
				st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
				failedAt = i
				if st.creates && errors.Is(err, fs.ErrExist) {
					r.notMade(st)
				}
				break
			}
			var e *store.Entry
			var err error
			if st.readback != nil {
				e, err = st.readback()
			}
			if err != nil {
				st.line.Outcome, st.line.Detail = shapes.Failed, "read back: "+err.Error()
				st.intent = nil // it may have happened: leave the intent pending
				failedAt = i
				break
			}
			if e != nil {
				st.record = e
			}
			if p, ok := strings.CutPrefix(st.target, "path:"); ok && isUnitPath(p) {
				r.unitDirty = true
			}
		}
		done = append(done, st)
	}
	// What was done is durable before it is recorded. A step whose change
	// cannot be made durable, or recorded (a full disk under the store,
	// an I/O error), changed the machine all the same: the report says so,
	// one failed line for each, with what it changed — never "1 failed"
	// over a batch that changed two hundred files. Their intents stay
	// pending, so the next apply settles each by looking.
	var unrecorded error
	if len(done) > 0 {
		if err := r.syncTouched(); err != nil {
			unrecorded = err
		}
	}
	var last *step // the last failed line, held back for the apply's stop
	for _, st := range done {
		if unrecorded == nil {
			if r.begun {
				r.st.Said(r.final(st.line)) // with its record, in one write
			}
			if unrecorded = r.record(st); unrecorded == nil {
				r.emitSaid(st.line, true)
				continue
			}
		}
		if st.change == nil {
			r.emit(st.line) // it changed nothing: its line stands as observed
			continue
		}
		if st.line.Module != "" {
			r.changed[st.line.Module+"."+st.line.ID] = true // restart_on: the machine did change
		}
		st.line.Detail = fmt.Sprintf("changed on the machine (%s: %s) but not recorded: %v; the next apply reads it back", st.line.Outcome, st.line.Detail, unrecorded)
		st.line.Outcome = shapes.Failed
		if last != nil {
			r.emit(last.line)
		}
		last = st
	}
	switch {
	case failedAt >= 0:
		if last != nil {
			r.emit(last.line)
		}
		// Later intents never started. The failed step's own intent stays
		// pending: its change may have half happened, and the next apply
		// settles it by looking.
		for _, st := range batch[failedAt+1:] {
			if st.intent != nil {
				r.abandon(st.target)
			}
		}
		rest := len(batch) - failedAt - 1 + after
		r.fail(batch[failedAt], nil, rest)
	case stoppedAt >= 0:
		if last != nil {
			r.emit(last.line)
		}
		for _, st := range batch[stoppedAt:] {
			if st.intent != nil {
				r.abandon(st.target)
			}
		}
		r.stopBefore(countWord(len(batch)-stoppedAt+after, "later step", "later steps"))
	case last != nil:
		r.fail(last, nil, after)
	case unrecorded != nil:
		r.fail(&step{line: shapes.Line{Type: "store", Outcome: shapes.Failed, Detail: unrecorded.Error()}}, nil, after)
	}
}

// record writes what a step did into the store: its entry, or its drop.
func (r *run) record(st *step) error {
	switch {
	case st.drop:
		if err := r.st.Drop(st.target); err != nil {
			return err
		}
		if st.entry != nil && st.entry.Original != nil && st.entry.Original.Digest != "" {
			r.forget = append(r.forget, st.entry.Original.Digest)
		}
	case st.record != nil:
		if st.res != nil && st.record.Recovered {
			// Declared again and applied: the host's own once more.
			rec := *st.record
			rec.Recovered = false
			st.record = &rec
		}
		return r.st.Put(st.record)
	}
	return nil
}

// declare notes that st's claim manages st's target in this declaration.
func (r *run) declare(st *step) {
	r.declared[claimTarget{st.claim, st.target}] = true
}

// claimTarget is a claim and the target it manages, as a map key (a
// struct, not a joined string: built for every resource of every apply).
type claimTarget struct {
	claim  store.Claim
	target string
}

// heldGone reports, for a thing held on an adopted node (its module not yet
// taken) that is gone now — deleted or removed by something other than the
// mesh — that it was: the line says so (held-changed), the record keeps
// it held, and nothing is made again before its module is taken (ADR 0100:
// adoption holds what it finds, and finding nothing is not leave to
// create).
func (r *run) heldGone(st *step, e *store.Entry, module, key, what string) bool {
	if !r.d.Adopted || r.taken[module] || e == nil || !e.Held {
		return false
	}
	r.heldOK[key] = false
	st.line.Outcome = shapes.HeldChanged
	st.line.Detail = fmt.Sprintf("held until module %s is taken, and %s by something else since it was found; not made again before the module is taken", module, what)
	if !e.Claimed(st.claim) {
		n := *e
		n.Claims = withClaim(e, st.claim)
		st.record = &n
	}
	return true
}

// recordAndEmit records st.record, if any (not in a plan), and emits the
// line: the end of an alone applier's step that changed nothing.
func (r *run) recordAndEmit(st *step, rest int) {
	if st.record != nil && !r.opt.Plan {
		if err := r.st.Put(st.record); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	r.emit(st.line)
}

// emit adds a line to the report, and streams it.
func (r *run) emit(l shapes.Line) { r.emitSaid(l, false) }

// final is the line as the report says it: found as declared where the
// apply of this declaration a cut stopped began a change and never
// recorded it, that apply made it, and no report of it said so. Said
// here, or by nobody.
//
// The same of a removal or a give-back it began (a key taken out of a
// shared file, a block): found done, with nothing left to give back, it
// is that apply's change, not "forgotten".
func (r *run) final(l shapes.Line) shapes.Line {
	key := resumedKey(store.Claim{Source: r.opt.Source, Module: l.Module, ID: l.ID}, l.Type)
	if l.Outcome == shapes.Unchanged && r.resumed[key] {
		l.Outcome = shapes.Applied
		l.Detail = "made by the apply of this declaration a power cut or a kill cut short, before it recorded it; recorded now: " + l.Detail
	}
	if l.Outcome == shapes.Failed && diskLines[l.Type] && strings.Contains(l.Detail, enospc) && !strings.Contains(l.Detail, diskFullSaid) {
		// Whichever step met it, said as what to do: the path in the
		// error says which disk.
		l.Detail += diskFullSaid
	}
	if op := r.resumedUndo[key]; op != "" && l.Outcome == shapes.Forgotten {
		l.Outcome = shapes.Removed
		if op == "restore" {
			l.Outcome = shapes.Restored
		}
		l.Detail = "undone by the apply of this declaration a power cut or a kill cut short, before it recorded it: " + l.Detail
	}
	return l
}

// enospc is how a full disk's error reads; diskFullSaid what a line that
// met it adds.
var enospc = unix.ENOSPC.Error()

const diskFullSaid = " (that disk is full: free room on it, and apply again)"

// diskLines are the lines whose ENOSPC is a disk's: an action's output, a
// firewall's set, a unit's own words may say it of something else.
var diskLines = map[string]bool{shapes.TypeFile: true, shapes.TypeDirectory: true, shapes.TypeArchive: true, shapes.TypeRegion: true, shapes.TypeKeys: true, "store": true}

// emitSaid is emit of a line the journal has been given already (said:
// before the record of its change, to go in the same write).
func (r *run) emitSaid(l shapes.Line, said bool) {
	l = r.final(l)
	r.lines = append(r.lines, l)
	if !r.opt.Plan {
		if !said && r.begun {
			// Kept only under this apply's begin: under none, the journal
			// would put the line with an apply cut short before.
			r.st.Said(l)
		}
		// Written now, if its record did not take it: a kill between the
		// two would leave a change recorded and said by no one.
		if err := r.st.FlushSaid(); err != nil {
			r.log.Warn("the journal could not keep what the apply said", "err", err)
		}
	}
	if l.Outcome == shapes.Applied || l.Outcome == shapes.Repaired {
		r.changed[l.Module+"."+l.ID] = true
		if r.repoFiles[l.Module+"."+l.ID] {
			r.repoDirty = true
		}
	}
	if r.opt.OnLine != nil {
		r.opt.OnLine(l)
	}
}

// fail appends st's failed line and stops the apply.
func (r *run) fail(st *step, err error, rest int) {
	if err != nil {
		st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
	}
	if rest > 0 {
		st.line.Detail += fmt.Sprintf("; the apply stopped here (%s not attempted)", countWord(rest, "later resource", "later resources"))
	}
	r.emit(st.line)
	r.stopped = true
}

// touch notes the filesystem a change was made on, for syncTouched. A
// converge writes a thousand files into a handful of directories: each
// directory is looked at once per batch, not once per file.
func (r *run) touch(dir string) {
	if r.touchedDirs[dir] {
		return
	}
	r.touchedDirs[dir] = true
	if info, err := fsx.Lstat(dir); err == nil && info.Kind == fsx.Dir {
		if _, ok := r.devs[info.Dev]; !ok {
			r.devs[info.Dev] = dir
		}
	}
}

// intendNow records a step's intent and makes it durable before the step
// changes anything: what the steps that run alone do first. It fails the
// step and reports false when the store cannot.
func (r *run) intendNow(st *step, in store.Intent, rest int) bool {
	if err := r.intend(st.target, in); err != nil {
		r.fail(st, err, rest)
		return false
	}
	if err := r.st.Sync(); err != nil {
		r.fail(st, err, rest)
		return false
	}
	return true
}

// intend records in as target's intent, the one place an apply does. An
// entry whose last intent a kill cut is recorded as settle made it, in
// the same record (store.IntendOver): the new intent replaces the cut
// one, and a second kill before the new change's record would otherwise
// settle it against the entry as it was before the first cut, losing
// what the first change may have made (a unit the host started, which
// the give-back would then leave running).
func (r *run) intend(target string, in store.Intent) error {
	if s := r.settled[target]; s != nil {
		delete(r.settled, target)
		if e := r.st.Get(target); e != nil && e.Pending != nil {
			r.replaced[target] = *e.Pending
			return r.st.IntendOver(target, s, in)
		}
	}
	return r.st.Intend(target, in)
}

// abandon records that target's intent was never begun. One that
// replaced an intent a kill cut (intend) gives that one back: the cut
// change is in doubt as before, and the entry as settled is no record of
// what was done.
func (r *run) abandon(target string) {
	if p, ok := r.replaced[target]; ok {
		delete(r.replaced, target)
		r.st.Intend(target, p)
		return
	}
	r.st.Abandon(target)
}

// notMade settles a step whose exclusive create found the thing made
// since the step looked (another applier's, a person's): the host made
// nothing there. What the host made before at the path and lost since
// (deleted by hand), or a create an earlier apply was cut in, is
// forgotten with the intent — the next apply finds what is there as
// found, never as the host's; an entry holding an original the host must
// give back keeps it, its intent abandoned.
func (r *run) notMade(st *step) {
	st.line.Detail += " (made by something else since this apply looked: not the host's, left as it is)"
	e := r.st.Get(st.target)
	if e != nil && !e.Stub && (!e.Created || e.Original != nil) {
		r.abandon(st.target)
		return
	}
	delete(r.replaced, st.target) // a cut create given back would claim it again
	if err := r.st.Drop(st.target); err != nil {
		// The intent stays: the next apply settles it by looking.
		st.line.Detail += fmt.Sprintf("; and the store could not forget it: %v", err)
	}
}

func (r *run) syncTouched() error {
	for dev, dir := range r.devs {
		// The directory may itself have been removed since: its parent is
		// on the same filesystem, or is the mount point above it.
		err := fsx.Syncfs(dir)
		for errors.Is(err, fsx.ErrNotExist) && dir != "/" {
			dir = parentOf(dir)
			err = fsx.Syncfs(dir)
		}
		if err != nil {
			return fmt.Errorf("make the changes durable: %w", err)
		}
		delete(r.devs, dev)
	}
	clear(r.touchedDirs)
	return nil
}

// settle turns an interrupted intent into what the machine can tell: an
// entry whose outcome is unknown, to be observed again. What the
// interrupted write may have left beside the file goes first.
func (r *run) settle(e *store.Entry, c store.Claim) *store.Entry {
	if e == nil || e.Pending == nil {
		return e
	}
	file, ok := strings.CutPrefix(e.Target, "path:")
	if !ok {
		_, file, _, ok = shapes.EditTarget(e.Target) // a region's or keys' file
	}
	leftBy := []string{}
	if ok {
		leftBy = append(leftBy, file)
	}
	if e.Type == shapes.TypeArchive {
		// An unpack writes each file through a temporary of its own:
		// one cut short may have left one beside any path it names.
		leftBy = append(leftBy, e.Pending.Paths...)
	}
	for _, f := range leftBy {
		tmp := filepath.Join(filepath.Dir(f), fsx.TempName(filepath.Base(f)))
		switch {
		case r.opt.Plan && fsx.HasLeftover(f):
			if r.leftovers == nil {
				r.leftovers = map[string]bool{}
			}
			r.leftovers[tmp] = true // as the apply finds its directory
		case !r.opt.Plan && fsx.RemoveLeftover(f):
			r.log.Info("removed what an interrupted write left", "path", tmp)
		}
	}
	p := e.Pending
	n := *e
	n.Pending, n.Stub = nil, false
	if n := r.st.IntentBegun(e.Target); n != 0 && slices.Contains(r.interrupted, n) {
		if p.Op == "remove" || p.Op == "restore" {
			r.resumedUndo[resumedKey(p.Claim, e.Type)] = p.Op
		} else {
			r.resumed[resumedKey(p.Claim, e.Type)] = true
		}
	}
	// What an interrupted change may have written is unknown: observe
	// again. An interrupted removal wrote nothing — the thing is there as
	// recorded, or gone — so what the host last wrote is still known, and
	// a removal resumed after a kill does not take the host's own content
	// for a hand edit. What the digest carries of earlier declarations
	// (a unit's last state and enablement, a user's last shell and home)
	// stays, as far as the change cut cannot have undone it
	// (keptOfDigest).
	if p.Op != "remove" {
		n.Digest = keptOfDigest(e.Type, e.Digest, p.Digest, e.Original != nil && e.Original.EnabledSet)
		if e.Type == shapes.TypeArchive && ValidDigest(p.Digest) && p.Digest != n.Digest {
			// The version the cut unpack was writing, beside the one the
			// record names: a file holding either is the host's, not a
			// hand edit (editedSince).
			r.cutVersion[e.Target] = p.Digest
		}
	}
	if p.Op == "change" || p.Op == "create" {
		// A held entry is never changed while held (its step records what
		// it finds, with no intent): a change begun on one was its taken
		// module's, and what it made is the host's — not held as found.
		n.Held = false
	}
	if e.Stub {
		n.Claims = []store.Claim{p.Claim}
		n.Created = p.Created
		n.Original = p.Original
	} else if n.Original == nil && p.Original != nil {
		n.Original = p.Original
	} else if o := p.Original; o != nil && o.Kind == shapes.TypeService && o.EnabledSet && !n.Original.EnabledSet {
		// A unit's enablement as the first declaration to set it found it,
		// kept with the intent of the change a kill cut (service).
		n.Original = o
	}
	if len(p.Paths) > 0 {
		all := map[string]bool{}
		for _, x := range n.Paths {
			all[x] = true
		}
		var wrote *versionFiles
		if e.Type == shapes.TypeArchive {
			wrote = r.filesOf(p.Digest, strings.TrimPrefix(e.Target, "archive:"))
		}
		for _, x := range p.Paths {
			if !all[x] && e.Type == shapes.TypeArchive && !reachedByCut(x, wrote) {
				continue
			}
			all[x] = true
		}
		n.Paths = nil
		for x := range all {
			n.Paths = append(n.Paths, x)
		}
		slices.Sort(n.Paths)
	}
	if !r.opt.Plan {
		// Kept apart from the step's copy, which the step may change
		// before its intent (intend records this one).
		k := n
		k.Claims, k.Paths = slices.Clone(n.Claims), slices.Clone(n.Paths)
		if n.Original != nil {
			o := *n.Original
			k.Original = &o
		}
		r.settled[e.Target] = &k
	}
	return &n
}

// resumedKey names a resource of a claim for run.resumed.
func resumedKey(c store.Claim, typ string) string { return c.Key() + " " + typ }

// precedence orders the sources when two declare the same thing: a rescue
// file fixes what it names, and the mesh does not undo it until the rescue
// no longer declares it; the link's word is above the bundle's.
var precedence = map[store.Source]int{store.Bundle: 1, store.Link: 2, store.Local: 3}

// yields reports whether st's target is held by a source above this one,
// and if so makes st a line that says so and records this source's claim
// without touching the machine. Without it, two sources declaring one file
// differently would rewrite it in turn at every reconcile.
func (r *run) yields(st *step, e *store.Entry) bool {
	var above []store.Claim
	if e != nil {
		above = r.higher(e.Claims)
	}
	if len(above) == 0 {
		typ := ""
		if st.res != nil {
			typ = st.res.Head().Type
		}
		across, how := r.aboveAcross(st.target, typ)
		if len(across) == 0 {
			return false
		}
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("%s by %s, which takes precedence; left as that source has it until it no longer declares it", how, joinClaims(across))
		if e != nil && !e.Claimed(st.claim) {
			n := *e
			n.Claims = withClaim(e, st.claim)
			st.record = &n
		}
		return true
	}
	st.line.Outcome = shapes.Held
	st.line.Detail = fmt.Sprintf("declared also by %s, which takes precedence; left as that source has it until it no longer declares it", joinClaims(above))
	if st.res != nil && st.res.Head().Type != e.Type {
		// A directory where the source above has a file, or the other
		// way: not the same thing, so not claimed. Claimed, the file would
		// pass to this source under the directory's name when the source
		// above lets it go, and be undone under that name too; unclaimed,
		// the source above undoes it, and this one makes its own after.
		st.line.Detail = fmt.Sprintf("declared also by %s, which takes precedence with a %s there; left as that source has it until it no longer declares it", joinClaims(above), e.Type)
		return true
	}
	if !e.Claimed(st.claim) {
		n := *e
		n.Claims = withClaim(e, st.claim)
		st.record = &n
	}
	return true
}

// higher is, of claims, those of sources above this run's.
func (r *run) higher(claims []store.Claim) []store.Claim {
	var above []store.Claim
	for _, c := range claims {
		if precedence[c.Source] > precedence[r.opt.Source] {
			above = append(above, c)
		}
	}
	return above
}

// aboveAcross is, for a file of type typ at target, what a source above
// this one declares of the same file in the other shape — for keys or a
// region, a file declared whole; for a file declared whole, keys or a
// region in it — and how the line says it. One file, two shapes: a rescue
// file's sshd_config declared whole and the link's keys in it would
// otherwise rewrite each other at every reconcile, as two sources'
// declarations of one target would (yields), and the same of the link's
// whole file and a rescue's keys.
func (r *run) aboveAcross(target, typ string) ([]store.Claim, string) {
	if _, p, _, ok := shapes.EditTarget(target); ok {
		if e := r.st.Get("path:" + p); e != nil && e.Type == shapes.TypeFile {
			return r.higher(e.Claims), p + " is declared whole"
		}
		return nil, ""
	}
	p, ok := strings.CutPrefix(target, "path:")
	if !ok || typ != shapes.TypeFile {
		return nil, ""
	}
	if above := r.higher(r.archivedAt(p)); len(above) > 0 {
		return above, p + " is unpacked by an archive"
	}
	return r.higher(r.editsAt(p)), p + " has keys or a region set in it"
}

// editsAt is the claims of the keys and regions the store records in the
// file at p, of any source.
func (r *run) editsAt(p string) []store.Claim {
	if r.edits == nil {
		r.edits = map[string][]store.Claim{}
		for _, e := range r.st.Entries() {
			if _, at, _, ok := shapes.EditTarget(e.Target); ok {
				r.edits[at] = append(r.edits[at], claimsOf(e)...)
			}
		}
	}
	return r.edits[p]
}

// archivedAt is the claims of the archives, of any source, that wrote
// path p and hold it (their entries' Paths); nil for none. A file or a
// directory found there was made by the host, not found on the machine:
// another source's file over it takes it as the host's creation
// (unpackedByOther), and an archive of a source above holds it
// (aboveAcross).
func (r *run) archivedAt(p string) []store.Claim {
	if r.unpackedBy == nil {
		r.unpackedBy = map[string][]store.Claim{}
		for _, e := range r.st.Entries() {
			if e.Type != shapes.TypeArchive {
				continue
			}
			paths, claims := e.Paths, claimsOf(e)
			if p := e.Pending; p != nil {
				// A cut apply's: what it may have written is in its
				// intent alone (settle claims it all).
				paths, claims = append(slices.Clone(paths), p.Paths...), append(slices.Clone(claims), p.Claim)
			}
			for _, x := range paths {
				r.unpackedBy[x] = append(r.unpackedBy[x], claims...)
			}
		}
	}
	return r.unpackedBy[p]
}

// unpackedByOther reports whether an archive of another source wrote path
// p and holds it. This source's own archive hands such a path over when it
// goes (planArchiveRemoval), and a file of it found there keeps the
// archive's entry as its original until then.
func (r *run) unpackedByOther(p string) bool {
	return slices.ContainsFunc(r.archivedAt(p), func(c store.Claim) bool { return c.Source != r.opt.Source })
}

// othersAt is the claims of sources other than this run's on what the
// store records at path p (a file or a directory another source
// declares), and those of them above this run's source.
func (r *run) othersAt(p string) (others, above []store.Claim) {
	e := r.st.Get("path:" + p)
	if e == nil {
		return nil, nil
	}
	for _, c := range claimsOf(e) {
		if c.Source != r.opt.Source {
			others = append(others, c)
		}
	}
	return others, r.higher(others)
}

// holds reports whether a thing of module, whose entry is e, is held on an
// adopted node: found there, its module not yet taken (ADR 0100). Every
// shape asks it of what it finds; a thing the host applied once is never
// held again.
func (r *run) holds(module string, e *store.Entry) bool {
	return r.d.Adopted && !r.taken[module] && (e == nil || e.Held)
}

// yieldAlone is yields for the steps that run alone: it records and emits.
func (r *run) yieldAlone(st *step, e *store.Entry, rest int) bool {
	if !r.yields(st, e) {
		return false
	}
	if st.record != nil && !r.opt.Plan {
		if err := r.st.Put(st.record); err != nil {
			r.fail(st, err, rest)
			return true
		}
	}
	r.emit(st.line)
	return true
}

// asDeclared ends a step that found its thing as declared: the store's
// entry is written again only if it says something else (another
// declaration, a claim it lacks, or stale for the caller's own reason),
// and the line is emitted.
func (r *run) asDeclared(st *step, e, n *store.Entry, stale bool, rest int) {
	if !r.opt.Plan && (e == nil || e.Digest != n.Digest || !e.Claimed(st.claim) || stale) {
		if err := r.st.Put(n); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	r.emit(st.line)
}

// changedOutcome is how a change is reported: repaired when the host had
// applied this very declaration (drift), applied otherwise.
func changedOutcome(e, n *store.Entry) shapes.Outcome {
	if e != nil && e.Digest == n.Digest {
		return shapes.Repaired
	}
	return shapes.Applied
}

// withClaim returns e's claims with c added.
func withClaim(e *store.Entry, c store.Claim) []store.Claim {
	if e == nil {
		return []store.Claim{c}
	}
	if e.Claimed(c) {
		return slices.Clone(e.Claims)
	}
	return append(slices.Clone(e.Claims), c)
}

func digest(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func modeString(m uint32) string { return fmt.Sprintf("%04o", m) }

// errorsIsAny reports whether err is any of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func joinClaims(cs []store.Claim) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.Key())
	}
	return strings.Join(s, ", ")
}

// checkParents refuses, before anything changes, a file or directory
// whose parent directory is neither on the machine nor declared as a
// directory before it: the apply would otherwise fail half-way, at the
// first write that has nowhere to go. A package or archive declared
// before it may bring the directory (/etc/nginx/conf.d), so after one the
// machine is left to answer at the write.
func (r *run) checkParents() error {
	declared := map[string]bool{}
	brings := false
	for _, res := range r.d.Resources {
		var p string
		switch x := res.(type) {
		case *shapes.File:
			p = x.Path
		case *shapes.Directory:
			p = x.Path
		case *shapes.Package, *shapes.Archive:
			brings = true
			continue
		default:
			continue
		}
		parent := path.Dir(p)
		if !brings && !declared[parent] && parent != p {
			// Absent only: what stands there otherwise (a link, a file)
			// is refused at the write, by fsx, which never follows it.
			if info, err := fsx.Lstat(parent); err == nil && info.Kind == fsx.Absent || errors.Is(err, fsx.ErrNotExist) {
				return &Refusal{fmt.Sprintf("resource %s field path: the directory %s is not there, and no directory resource before it declares it (declare it, or the package that brings it, first)", res.Head().Key(), parent)}
			}
		}
		if _, ok := res.(*shapes.Directory); ok {
			declared[p] = true
		}
	}
	return nil
}
