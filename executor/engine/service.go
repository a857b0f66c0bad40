package engine

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A service puts a unit the init already knows into a state; it never
// installs one. What the host changes is recorded against the state it
// first found the unit in, once, and undeclaring gives that back (ADR
// 0118): a unit found running is left running; one the host started is
// stopped again, one it enabled disabled again; nothing is started on the
// way out; a unit whose found state is unknown is left alone.

// desiredService is the summary of a service declaration the entry keeps,
// so a later apply can tell drift from a changed declaration.
func desiredService(s *shapes.Service) string {
	en := "-"
	if s.Enabled != nil {
		en = fmt.Sprint(*s.Enabled)
	}
	return "state=" + s.State + " enabled=" + en
}

// recordedService is what the entry keeps of a service declaration
// (desiredService) and, while it sets no state, the last state one did
// (was=, from prev, the entry's digest before): a unit the host started
// under one declaration and left alone under the next is still the host's
// change, given back when it is undeclared (ADR 0118), whatever the last
// declaration said. The same of its enablement (was-enabled=): a unit the
// host enabled is disabled again on the way out, one a declaration kept
// disabled is not — enabled since by someone else, it is theirs. A
// release that reads neither reads the rest as before.
func recordedService(s *shapes.Service, prev string) string {
	d := desiredService(s)
	if s.State == "" {
		if was := lastStateOf(prev); was != "" {
			d += " was=" + was
		}
	}
	if s.Enabled == nil {
		if was := lastEnabledOf(prev); was != "" {
			d += " was-enabled=" + was
		}
	}
	return d
}

// keptOfDigest is what an entry's digest keeps through an interrupted
// change, which has the thing observed again (its digest otherwise
// blanked): of a service, the last state and enablement a declaration
// set; of a user, the last shell and home — what the host did under an
// earlier declaration is its change still, whatever the kill cut.
//
// cut is the digest the change a kill cut would have recorded (its
// intent's), "" where the intent does not carry one (written by an
// earlier release, or compacted into a snapshot format without it). The
// change may or may not have been made, so a unit's state is kept as
// running where either says running, and its enablement as enabled where
// either says enabled: the give-back stops and disables only a unit found
// stopped or disabled and running or enabled now, so keeping the other
// could leave the host's own start, while keeping this one reads a start
// made by another after a change cut before it was made as the host's —
// a start the declaration asked for. Without cut, of an enablement only an enabled one is
// kept: the change cut may have enabled the unit whatever the one before
// said, and without a kept value the unit's enablement reads as the
// host's wherever some declaration set it (lastEnabledOf), given back
// rather than left; a start it may have made is not known.
//
// enabledSet says that a declaration before the cut set the unit's
// enablement (its record's found state says so): a digest written before
// the last enablement was carried then reads as enabled by the host, as
// the give-back reads it, and is kept so.
func keptOfDigest(typ, digest, cut string, enabledSet bool) string {
	switch typ {
	case shapes.TypeService:
		var kept []string
		state, enabled := lastStateOf(digest), lastEnabledOf(digest)
		if enabled == "" && enabledSet {
			enabled = "true"
		}
		if cut != "" {
			if state != "running" {
				state = cmp.Or(lastStateOf(cut), state)
			}
			if enabled != "true" {
				enabled = cmp.Or(lastEnabledOf(cut), enabled)
			}
		} else if enabled != "true" {
			enabled = ""
		}
		if state != "" {
			kept = append(kept, "was="+state)
		}
		if enabled != "" {
			kept = append(kept, "was-enabled="+enabled)
		}
		return strings.Join(kept, " ")
	case shapes.TypeUser:
		// The cut change's shell and home (or the last before, where it set
		// none: its digest carries them): the give-back gives back only
		// what is still what the mesh set, and the cut is most likely
		// made — a power cut takes the record, not yet synced, long after
		// the usermod. Cut before its usermod, the earlier declaration's
		// shell is left, as a shell changed by another is.
		return keptOfUserDigest(cmp.Or(cut, digest))
	case shapes.TypeArchive:
		// The version the record named before the cut (what a look at
		// its files compares them with, editedSince), else the one the
		// cut unpack was writing: as an unpack that fails part way
		// records it.
		return cmp.Or(digest, cut)
	}
	return ""
}

// lastStateOf is the last state a declaration of the unit set, from an
// entry's digest: its own, or the one carried (was=); "" for none ever.
func lastStateOf(digest string) string {
	state, _ := declaredOf(digest)
	if state != "" {
		return state
	}
	for _, f := range strings.Fields(digest) {
		if v, ok := strings.CutPrefix(f, "was="); ok {
			return v
		}
	}
	return ""
}

// lastEnabledOf is the last enablement a declaration of the unit set
// ("true" or "false"), from an entry's digest: its own, or the one
// carried (was-enabled=); "-" for none the host applied; "" for none, or
// for a digest written before the value was carried
// (store.Original.EnabledSet then says whether one did).
func lastEnabledOf(digest string) string {
	var carried string
	for _, f := range strings.Fields(digest) {
		if v, ok := strings.CutPrefix(f, "enabled="); ok && v != "-" {
			return v
		}
		if v, ok := strings.CutPrefix(f, "was-enabled="); ok {
			carried = v
		}
	}
	return carried
}

func describeState(s initsys.State) string {
	run := "stopped"
	if s.Running {
		run = "running"
	}
	if s.Enabled == "" {
		return run
	}
	return run + ", " + s.Enabled
}

// service observes a unit, changes it when it differs, and reads it back.
// rest is how many resources follow, for a failure's message.
func (r *run) service(st *step, rest int) {
	svc := st.res.(*shapes.Service)
	r.reloadUnits()
	unit := r.units[svc.Key()]
	if r.unitComing[svc.Key()] {
		// Brought by this declaration's package or unit file: now that
		// they are applied, the unit goes by the init's own name for it
		// (OpenRC, runit and s6 name it bare), as every later apply will
		// find it — one record, not two.
		if cur, err := r.init.State(r.ctx, unit); err == nil && cur.Known && cur.Name != "" && cur.Name != unit {
			delete(r.declared, claimTarget{st.claim, "service:" + unit})
			unit = cur.Name
			r.units[svc.Key()] = unit
		}
	}
	st.target = "service:" + unit
	r.declare(st)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yields(st, e) {
		if st.record != nil && !r.opt.Plan {
			if err := r.st.Put(st.record); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc, false)
		return
	}
	cur, err := r.init.State(r.ctx, unit)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if !cur.Known && r.unitGone[svc.Key()] {
		// Removed by hand since the host applied it. A service never
		// installs a unit: this line fails, its record stays (so the next
		// apply says the same, rather than refusing the declaration), and
		// the rest of the declaration applies.
		st.line.Outcome = shapes.Failed
		st.line.Detail = fmt.Sprintf("%s knows no unit %q any more: it was removed since the host last applied it (a service never installs one); nothing done, the rest applies", r.init.Name(), unit)
		r.emit(st.line)
		return
	}
	if !cur.Known && r.opt.Plan && r.unitComing[svc.Key()] {
		st.line.Outcome = shapes.Applied
		st.line.Detail = fmt.Sprintf("its unit comes with this declaration's package or unit file, %s; then put in its declared state (%s)", planDoesNotApply, desiredService(svc))
		if r.holds(svc.Module, e) {
			// The apply holds what it finds, however it came.
			st.line.Outcome = shapes.Held
			st.line.Detail = fmt.Sprintf("its unit comes with this declaration's package or unit file, %s; then held as found, on an adopted node, until module %s is taken", planDoesNotApply, svc.Module)
		}
		r.serviceDone(st, svc, false)
		return
	}
	if !cur.Known {
		r.fail(st, fmt.Errorf("%s knows no unit %q, even after the unit file or package declared before it was applied", r.init.Name(), unit), rest)
		return
	}
	var prev string
	switch {
	case e != nil && e.Held:
		// Held, the host applied none of the declarations it was given:
		// none of them set the unit's enablement, though the found one
		// is recorded (a held declaration set it) — said so, not left
		// for a record from before the digest carried it.
		prev = "was-enabled=-"
	case e != nil:
		prev = e.Digest
	}
	desired := recordedService(svc, prev)
	// The state the unit was found in, recorded once (ADR 0118): whether
	// it ran, and its enablement only where a declaration sets it — the
	// first time one does, before the host has touched it. A unit the mesh
	// brought (this declaration's unit file, or a package the host
	// installed, in this apply or an earlier one: foundAbsent) was found
	// absent, whatever its package's scripts did to it before this step
	// looked. A record from before the host kept what it found (Original
	// nil) has no found state, and none is made up for it: by now the
	// unit's state may be the mesh's doing, and recording that as found
	// would have an undeclare stop or disable what the mesh may never have
	// changed. It stays unknown (nil), however often it is applied, and an
	// undeclare leaves the unit alone.
	var orig *store.Original
	var broughtBy string // what brought a unit found absent
	switch {
	case e != nil && e.Original != nil:
		o := *e.Original // later applies never overwrite it
		if svc.Enabled != nil && !enablementKnown(&o) {
			o.Enabled, o.EnabledSet = cur.Enabled, true
		}
		orig = &o
	case e != nil:
		// unknown: stays so
	default:
		if broughtBy, err = r.foundAbsent(svc, unit); err != nil {
			r.fail(st, err, rest)
			return
		}
		if broughtBy != "" {
			// Running as first looked at, absent or not: a held unit is
			// told changed against it (never given back: absent is).
			orig = &store.Original{Kind: shapes.TypeService, Absent: true, Running: cur.Running}
		} else {
			orig = &store.Original{Kind: shapes.TypeService, Running: cur.Running}
		}
		// Enablement, where declared, as first looked at, absent or not:
		// recorded at a later apply instead, it would take an operator's
		// change since for what was found.
		if svc.Enabled != nil {
			orig.Enabled, orig.EnabledSet = cur.Enabled, true
		}
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeService, Claims: withClaim(e, st.claim), Original: orig, Digest: desired}
	if e != nil {
		n.Order, n.Held = e.Order, e.Held
	}

	// Held: found on an adopted node, its module not yet taken.
	if r.holds(svc.Module, e) {
		r.heldOK[svc.Key()] = (svc.State == "" || (svc.State == "running") == cur.Running) &&
			(svc.Enabled == nil || *svc.Enabled == cur.IsEnabled())
		n.Held, n.Digest = true, ""
		st.line.Outcome = shapes.Held
		st.line.Detail = fmt.Sprintf("found %s on an adopted node; held as found until module %s is taken", describeState(cur), svc.Module)
		// Changed since it was found in what the host recorded of it:
		// whether it ran, and its enablement only once a declaration set
		// it (before, an unrecorded enablement is no change: comparing it
		// said held-changed of every held unit with no enabled declared).
		if e != nil && orig != nil && (orig.Running != cur.Running || enablementKnown(orig) && orig.Enabled != cur.Enabled) {
			st.line.Outcome = shapes.HeldChanged
			st.line.Detail = fmt.Sprintf("held until module %s is taken, and changed by something else since it was found (now %s); left as it is", svc.Module, describeState(cur))
		}
		// The enablement first declared while held is recorded then, as
		// it would be were the module taken.
		if !r.opt.Plan && (e == nil || !e.Claimed(st.claim) || !sameOriginal(orig, e.Original)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc, false)
		return
	}
	n.Held = false

	start := svc.State == "running" && !cur.Running
	stop := svc.State == "stopped" && cur.Running
	setEnabled := svc.Enabled != nil && *svc.Enabled != cur.IsEnabled()
	if cur.Enabled == "masked" && (start || setEnabled) {
		// The host never unmasks a unit: a mask is an operator's word
		// that it must not run.
		r.fail(st, fmt.Errorf("%s is masked: the init will not start or enable it, and the host never unmasks a unit (unmask it by hand if it should run)", unit), rest)
		return
	}
	if !start && !stop && !setEnabled {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, describeState(cur)
		if e == nil && orig.Absent { // a new record always has orig
			// Nothing to do to it, but it is new: the mesh brought it.
			st.line.Outcome = shapes.Applied
			st.line.Detail += "; brought by " + broughtBy + " (found absent): " + absentGiveBack(svc)
		}
		if !r.opt.Plan && (e == nil || e.Digest != desired || !e.Claimed(st.claim) || e.Held || !sameOriginal(orig, e.Original)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.serviceDone(st, svc, false)
		return
	}
	st.line.Outcome = shapes.Applied
	if e != nil && e.Digest == desired {
		st.line.Outcome = shapes.Repaired
	}
	var did []string
	if start {
		did = append(did, "started")
	}
	if stop {
		did = append(did, "stopped")
	}
	if setEnabled {
		if *svc.Enabled {
			did = append(did, "enabled at boot")
		} else {
			did = append(did, "disabled at boot")
		}
	}
	found := describeState(cur)
	if orig != nil && orig.Absent {
		if broughtBy == "" { // recorded so by an earlier apply
			broughtBy = "the mesh"
		}
		found = "absent: brought by " + broughtBy + ", " + found
	}
	st.line.Detail = fmt.Sprintf("%s (found %s)", strings.Join(did, ", "), found)
	switch {
	case e == nil:
		st.line.Detail += "; the state it was found in is kept and given back when this is undeclared"
	case orig == nil:
		st.line.Detail += "; the state the host first found it in is unknown (its record is older than the host's keeping it): undeclaring leaves it as it is"
	}
	if r.opt.Plan {
		r.serviceDone(st, svc, start)
		return
	}
	// The intent carries what the change records once done, for a kill
	// that cuts it before the record (keptOfDigest).
	in := store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeService, Digest: n.Digest}
	if e == nil || !sameOriginal(orig, e.Original) {
		// What is found is kept before the unit is changed: a first
		// record, or the enablement the first declaration to set it found
		// (a kill before the record would leave the next apply finding
		// the host's own change, and taking it for what was found).
		in.Original = orig
	}
	if !r.intendNow(st, in, rest) {
		return
	}
	if setEnabled {
		if err := r.init.SetEnabled(r.ctx, unit, *svc.Enabled); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	if start {
		err = r.init.Start(r.ctx, unit)
	} else if stop {
		err = r.init.Stop(r.ctx, unit)
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	got, err := r.init.State(r.ctx, unit)
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	if (svc.State == "running" && !got.Running) || (svc.State == "stopped" && got.Running) ||
		(svc.Enabled != nil && *svc.Enabled != got.IsEnabled()) {
		r.fail(st, fmt.Errorf("read back: %s is %s, not %s", unit, describeState(got), desiredService(svc)), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.serviceDone(st, svc, start)
}

// absentGiveBack says, for a unit found absent, what undeclaring svc will
// do to it once nothing that brought it is declared (planServiceRemoval).
func absentGiveBack(svc *shapes.Service) string {
	switch {
	case svc.State != "":
		return "undeclaring stops and disables it"
	case svc.Enabled != nil:
		return "declared with no state, undeclaring never stops it; it disables it"
	}
	return "declared with no state, undeclaring never stops or disables it"
}

// foundAbsent says what brought the unit svc declares (unit, by the init's
// name for it) when it was absent before the mesh, "" when it was not:
//
//   - a unit file of this declaration, where the init did not know the unit
//     when the declaration was checked (so the host writes that file, it
//     does not replace one);
//   - the package that brings it — the one that owns the unit's file, by
//     the package manager's own database — where that package's own record
//     says the host installed it (it was not found installed).
//
// Asked of who brings the unit, not of what the declaration holds, it is
// the same whether the package came in this apply or an earlier one, and
// another package declared beside it counts for nothing. A unit of a
// package that was found installed is found as it is.
func (r *run) foundAbsent(svc *shapes.Service, unit string) (string, error) {
	if r.unitComing[svc.Key()] && r.unitFiles[shapes.NormaliseUnit(svc.Unit)] {
		return "this declaration's unit file", nil
	}
	installed := map[string]bool{}
	for _, e := range r.st.Entries() {
		typ, created := e.Type, e.Created
		if p := e.Pending; p != nil {
			// An install cut off before it was recorded: its intent says
			// whether the package was there before.
			typ, created = p.Type, created || p.Created
		}
		if typ == shapes.TypePackage && created && !e.Held {
			installed[strings.TrimPrefix(e.Target, "package:")] = true
		}
	}
	if len(installed) == 0 {
		return "", nil // the host installed nothing: no package of its brings the unit
	}
	mgr, err := r.packages()
	if err == nil {
		var owners []string
		if owners, err = mgr.owners(r.ctx, unitDefinitions(unit)); err == nil {
			for _, o := range owners {
				if installed[o] {
					return fmt.Sprintf("package %s, which the host installed", o), nil
				}
			}
			return "", nil
		}
	}
	// Recorded once, the found state cannot be guessed: the line fails,
	// nothing is recorded, and the next apply asks again.
	return "", fmt.Errorf("cannot tell whether %s comes with a package the host installed, so not the state it was found in either: %w", unit, err)
}

// stillBrought says what, of what brought a unit found absent, a
// declaration still names once this apply is done — "" when nothing does:
//
//   - a unit file defining it (unitDefinitions) that a declaration still
//     declares;
//   - a package that owns the unit's file, by the package manager's own
//     database, that a declaration still declares: of this source, under
//     any module or id, or of another source.
//
// A unit is given back to absent only when nothing that brought it is
// declared any more. While base still installs openssh-server, the unit it
// brings is base's as much as sshd's: unassigning sshd must not stop it.
// The package manager is asked only when a package the host has a record
// of is still declared; when it cannot say, nothing is guessed (the line
// fails and the record stays, for the next apply to ask again).
func (r *run) stillBrought(unit string) (string, error) {
	for _, p := range unitDefinitions(unit) {
		if by := r.declaredBy("path:" + p); by != "" {
			return fmt.Sprintf("its unit file %s, which %s still declares", p, by), nil
		}
	}
	pkgs := map[string]string{} // package name → what still declares it
	for _, e := range r.st.Entries() {
		if name, ok := strings.CutPrefix(e.Target, "package:"); ok {
			if by := r.declaredBy(e.Target); by != "" {
				pkgs[name] = by
			}
		}
	}
	if len(pkgs) == 0 {
		return "", nil
	}
	mgr, err := r.packages()
	if err == nil {
		var owners []string
		if owners, err = mgr.owners(r.ctx, unitDefinitions(unit)); err == nil {
			for _, o := range owners {
				if by, ok := pkgs[o]; ok {
					return fmt.Sprintf("package %s, which %s still declares", o, by), nil
				}
			}
			return "", nil
		}
	}
	return "", fmt.Errorf("cannot tell whether %s came with a package still declared, so not whether to give it back to absent: %w", unit, err)
}

// declaredBy names what declares target once this apply is done: a
// resource of this declaration (module.id), or a claim of another source
// (source:module.id); "" when nothing does.
func (r *run) declaredBy(target string) string {
	if r.declaredTargets == nil {
		r.declaredTargets = make(map[string]string, len(r.declared))
		for ct := range r.declared {
			if _, ok := r.declaredTargets[ct.target]; !ok {
				r.declaredTargets[ct.target] = ct.claim.Module + "." + ct.claim.ID
			}
		}
	}
	if by, ok := r.declaredTargets[target]; ok {
		return by
	}
	if e := r.st.Get(target); e != nil {
		for _, c := range e.Claims {
			if c.Source != r.opt.Source {
				return c.Key()
			}
		}
	}
	return ""
}

// scanDirs are the directories runit and s6 supervise from, whose entries
// are normally links to a service definition elsewhere (/etc/sv on
// Debian's runit).
var scanDirs = []string{"/etc/service", "/etc/s6/scan", "/run/service", "/service"}

// unitDefinitions are the files that may define unit, for a package to own:
// systemd's unit file (an instance's by its template), OpenRC's script,
// runit's and s6's run script. Every init is asked about at once, by the
// name systemd gives a service and the bare one the others do; a path
// through a link (a scanned directory's entry) also by what it leads to,
// which is what a package ships. A path that does not exist is asked about
// too: its package manager says no package owns it.
func unitDefinitions(unit string) []string {
	bare := strings.TrimSuffix(unit, ".service")
	names := []string{unit}
	if at := strings.Index(unit, "@"); at > 0 {
		if dot := strings.LastIndex(unit, "."); dot > at {
			names = append(names, unit[:at+1]+unit[dot:]) // u@x.service → u@.service
		}
	}
	var paths []string
	for _, d := range unitDirs {
		for _, n := range names {
			paths = append(paths, d+"/"+n)
		}
	}
	paths = append(paths, "/etc/init.d/"+bare, "/etc/sv/"+bare+"/run")
	for _, d := range scanDirs {
		run := d + "/" + bare + "/run"
		paths = append(paths, run)
		if real, err := filepath.EvalSymlinks(run); err == nil && real != run {
			paths = append(paths, real)
		}
	}
	return paths
}

// serviceDone emits the service's line now, or, for one with restart_on,
// after the apply's last step, when it is known whether a file it names
// changed. started: this step started the unit (a plan: would start it).
// A plan does not start it, so the decision at the end cannot ask the
// init whether it runs: it is told, the same in a plan and in the apply
// (plan prints the lines the next apply would).
func (r *run) serviceDone(st *step, svc *shapes.Service, started bool) {
	if len(svc.RestartOn) > 0 {
		p := pendingRestart{st: st, svc: svc, started: started}
		if started {
			// What changed before the start, the unit read as it
			// started: no reason to restart it again.
			p.read = map[string]bool{}
			for _, key := range restartKeys(svc) {
				p.read[key] = r.changed[key]
			}
		}
		r.restarts = append(r.restarts, p)
		return
	}
	r.emit(st.line)
}

type pendingRestart struct {
	st  *step
	svc *shapes.Service
	// started: the service's step started the unit, or in a plan would;
	// read: then, which of the files it names had changed before.
	started bool
	read    map[string]bool
}

// restartKeys is the files svc's restart_on names, each as "module.id".
func restartKeys(svc *shapes.Service) []string {
	keys := make([]string, 0, len(svc.RestartOn))
	for _, ref := range svc.RestartOn {
		if !strings.Contains(ref, ".") {
			ref = svc.Module + "." + ref
		}
		keys = append(keys, ref)
	}
	return keys
}

// restartOn restarts, after the apply's last step, each unit a changed file
// names — drift repairs included. A unit declared with no state is
// restarted only if it is running; a stopped one is never started by this.
// A unit this apply started is restarted only for a file that changed
// after it started: it read the others as it started.
//
// A restart an apply could not give — it stopped (asked to, or at a
// failure) after the file changed and before the restart — is owed, kept
// in the store (owe, keepOwed), and given by the next apply of the source
// that still declares the service: that apply finds the file as declared,
// and without it the unit would run on the old file until something else
// restarted it.
func (r *run) restartOn() {
	reached := map[string]bool{}
	for _, p := range r.restarts {
		st, svc := p.st, p.svc
		unit := r.units[svc.Key()]
		reached[unit] = true
		if r.stopped || st.line.Outcome == shapes.Failed {
			if st.line.Outcome != shapes.Failed {
				st.line.Detail += "; not restarted: the apply stopped before its end"
			}
			r.owe(unit, svc)
			r.lines = append(r.lines, st.line)
			if r.opt.OnLine != nil {
				r.opt.OnLine(st.line)
			}
			continue
		}
		var changed, read []string
		owedKeys := false
		for _, key := range restartKeys(svc) {
			was := r.owes(unit, key)
			switch {
			case !r.changed[key] && !was:
			case p.read[key] || was && p.started && !r.changed[key]:
				read = append(read, key)
			default:
				changed = append(changed, key)
				owedKeys = owedKeys || was && !r.changed[key]
			}
		}
		if len(changed) == 0 && len(read) > 0 {
			st.line.Detail += fmt.Sprintf("; %s changed before this apply started it: not restarted", strings.Join(read, ", "))
		}
		given := true
		if len(changed) > 0 && svc.State != "stopped" {
			why := fmt.Sprintf("%s changed", strings.Join(changed, ", "))
			if p.started {
				why += " after this apply started it"
			}
			if owedKeys {
				why += " (owed by an apply that stopped before it could restart it)"
			}
			// Started by its step, it runs, though a plan's init does not
			// know it; otherwise the init says.
			running, err := p.started, error(nil)
			if !running {
				var cur initsys.State
				cur, err = r.init.State(r.ctx, unit)
				running = cur.Running
			}
			switch {
			case err != nil:
				st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
				given = false
			case !running:
				st.line.Detail += fmt.Sprintf("; %s, but the unit is not running: not started", why)
			case r.opt.Plan:
				st.line.Detail += "; would be restarted: " + why
				st.line.Outcome = worse(st.line.Outcome, shapes.Applied)
			default:
				if err := r.init.Restart(r.ctx, unit); err != nil {
					st.line.Outcome, st.line.Detail = shapes.Failed, err.Error()
					given = false
				} else {
					st.line.Detail += "; restarted: " + why
					st.line.Outcome = worse(st.line.Outcome, shapes.Applied)
				}
			}
		}
		if given {
			delete(r.owedNow, unit)
		} else {
			r.owe(unit, svc)
		}
		r.emit(st.line)
	}
	r.restarts = nil
	// The services an apply that stopped never reached.
	if r.stopped {
		for _, res := range r.d.Resources {
			if svc, ok := res.(*shapes.Service); ok && len(svc.RestartOn) > 0 && !reached[r.units[svc.Key()]] {
				r.owe(r.units[svc.Key()], svc)
			}
		}
	}
}

// owe keeps the restart of unit, svc's, owed for the files of its
// restart_on this apply changed or an apply before owed it.
func (r *run) owe(unit string, svc *shapes.Service) {
	var keys []string
	for _, key := range restartKeys(svc) {
		if r.changed[key] || r.owes(unit, key) {
			keys = append(keys, key)
		}
	}
	if len(keys) > 0 && unit != "" {
		r.owedNow[unit] = keys
	}
}

// owes says whether a restart of unit is owed for key: kept by an apply
// that stopped before the restart, or a change an apply of this source a
// kill or a power cut ended had said (store.CutChanged: the journal keeps
// what it said, and nothing of what it owed).
func (r *run) owes(unit, key string) bool {
	return slices.Contains(r.owed[unit], key) || r.cutChanged[key]
}

// keepOwed writes what this apply leaves owed, of the units its
// declaration still declares with a restart_on (one no longer declared is
// not restarted for it), when that differs from what it found or it gave
// what cut applies owed (their changes are then forgotten). Not kept (a
// full disk), a restart owed is lost, said in the log.
func (r *run) keepOwed() {
	if r.opt.Plan {
		return
	}
	declared := map[string]bool{}
	for _, res := range r.d.Resources {
		if svc, ok := res.(*shapes.Service); ok && len(svc.RestartOn) > 0 {
			declared[r.units[svc.Key()]] = true
		}
	}
	maps.DeleteFunc(r.owedNow, func(unit string, _ []string) bool { return !declared[unit] })
	if maps.EqualFunc(r.owed, r.owedNow, slices.Equal) && len(r.cutChanged) == 0 {
		return
	}
	switch err := r.st.SetRestartsOwed(r.opt.Source, r.owedNow); {
	case errors.Is(err, store.ErrOwedAside):
		r.log.Warn("what restarts were owed could not be read", "owed", r.owedNow, "err", err)
	case err != nil:
		r.log.Warn("the restarts this apply owes could not be kept: the next apply does not give them", "owed", r.owedNow, "err", err)
	}
}

// worse returns the more severe of two outcomes.
func worse(a, b shapes.Outcome) shapes.Outcome {
	if shapes.Severity(b) < shapes.Severity(a) {
		return b
	}
	return a
}

// sameOriginal reports whether a and b record the same found state, nil
// (unknown) being the same only as nil.
func sameOriginal(a, b *store.Original) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// enablementKnown reports whether o holds the unit's enablement as found:
// recorded when a declaration first set it, or by a record written before
// the host kept that apart (which recorded it always).
func enablementKnown(o *store.Original) bool { return o.EnabledSet || o.Enabled != "" }

// declaredOf reads back, from an entry's digest (desiredService), what
// the last declaration of the unit set: its state ("" for none) and
// whether it set enablement.
func declaredOf(digest string) (state string, enabled bool) {
	for _, f := range strings.Fields(digest) {
		if v, ok := strings.CutPrefix(f, "state="); ok {
			state = v
		}
		if v, ok := strings.CutPrefix(f, "enabled="); ok {
			enabled = v != "-"
		}
	}
	return state, enabled
}

// planServiceRemoval gives a unit back the state it was first found in
// (ADR 0118), and only what the host changed:
//
//   - its running state only where a declaration set a state, as the
//     last that set one said (a declaration with no state after it leaves
//     the host's change the host's: recordedService): a unit no
//     declaration gave a state is forgotten, whatever it does now;
//   - a unit the host started (found stopped, declared running) is
//     stopped again; one found running, or one the host stopped, is left
//     as it is — nothing is started on the way out;
//   - its enablement only where a declaration set enabled, and only back
//     to disabled: one the host enabled is disabled again;
//   - a unit found absent (a unit file or package the mesh declared
//     brought it) is stopped and disabled once nothing that brought it is
//     declared any more: the mesh gave, the mesh takes back. While a
//     declaration still names its package or unit file (another module's,
//     or the same under another id) it is forgotten, left as it is; and a
//     unit declared with no state is never stopped, only disabled where
//     enabled was declared;
//   - a masked unit is never unmasked; a unit whose found state is
//     unknown, or that is gone, is left alone.
//
// Settings given back by their own resources never restart it.
func (r *run) planServiceRemoval(st *step) {
	e := st.entry
	unit := strings.TrimPrefix(e.Target, "service:")
	st.drop = true
	o := e.Original
	if e.Held || o == nil {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the state it was found in is unknown; left as it is"
		if e.Held {
			st.line.Detail = "held as found on an adopted node; left as it is"
		}
		return
	}
	if r.init == nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "this host cannot drive its init to give the unit back", false
		return
	}
	cur, err := r.init.State(r.ctx, unit)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	if !cur.Known {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, "the unit is gone (removed since); nothing to give back"
		return
	}
	// What a declaration of it set, the last that did: a state or an
	// enablement the host applied under an earlier declaration is the
	// host's change still, though the last one set none.
	_, enabledSet := declaredOf(e.Digest)
	state, enabledSet := lastStateOf(e.Digest), enabledSet || o.EnabledSet
	// Enabled by the host: the last enablement declared was on. A record
	// that does not carry it (written before it did) says only that some
	// declaration set it, and is read as on, as it was then.
	lastEnabled := lastEnabledOf(e.Digest)
	enabledByHost := lastEnabled == "true" || (lastEnabled == "" && enabledSet)
	masked := cur.Enabled == "masked"
	var stop, disable bool
	var bringer string // what still declared brought a unit found absent
	if o.Absent {
		if bringer, err = r.stillBrought(unit); err != nil {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
			return
		}
	}
	switch {
	case bringer != "":
		// The package (or unit file) that brought it is still declared,
		// by another module or under another id: the unit is that
		// declaration's now, as much as it would be had the package
		// been declared alone. Giving it back to absent while it stays
		// would stop the ssh daemon base installs when sshd goes.
	case o.Absent:
		// The mesh gave, the mesh takes back — but only what the
		// declaration said: a unit declared with no state was never
		// started by the mesh, and is never stopped on its way out,
		// whoever installed it (the container runtime a network names
		// only for restart_on). Its enablement goes back to absent
		// (disabled) where a state or enabled was declared.
		stop = state != "" && cur.Running
		disable = (state != "" || enabledSet) && cur.IsEnabled() && !masked
	default:
		stop = state == "running" && !o.Running && cur.Running
		disable = enabledByHost && enablementKnown(o) && !(initsys.State{Enabled: o.Enabled}).IsEnabled() && cur.IsEnabled() && !masked
	}
	if !stop && !disable {
		st.line.Outcome = shapes.Forgotten
		var why []string
		switch {
		case bringer != "":
			why = append(why, "it came with "+bringer+": a unit is given back to absent only once what brought it is undeclared")
		case state == "":
			why = append(why, "declared with no state: the host never started or stopped it")
		case o.Absent:
			why = append(why, "the mesh brought it, and it is "+describeState(cur)+" already")
		case cur.Running && o.Running:
			why = append(why, "it was running before the mesh")
		case !cur.Running && o.Running:
			why = append(why, "it was running before the mesh and is stopped now; never started on the way out")
		case cur.Running:
			why = append(why, "the host did not start it")
		default:
			why = append(why, "stopped, as it was found")
		}
		switch {
		case masked:
			why = append(why, "it is masked, and the host never unmasks a unit")
		case bringer == "" && (!enabledSet || lastEnabled == "-") && (!o.Absent || state == ""):
			why = append(why, "its enablement was never declared")
		case !o.Absent && !enabledByHost && cur.IsEnabled():
			why = append(why, "the last declaration of its enablement said disabled: enabled since by someone else")
		}
		st.line.Detail = strings.Join(why, "; ") + "; left as it is (" + describeState(cur) + ")"
		return
	}
	var did []string
	if stop {
		did = append(did, "stopped again")
	}
	if disable {
		did = append(did, "disabled again")
	}
	st.line.Outcome = shapes.Restored
	st.line.Detail = strings.Join(did, " and ") + ", as the host found it"
	if o.Absent {
		st.line.Detail = strings.Join(did, " and ") + ": it did not exist before the declaration that brought it (the mesh gave, the mesh takes back)"
	}
	if masked && stop {
		st.line.Detail += "; it is masked, and stays masked"
	}
	if r.opt.Plan {
		st.line.Detail = "would be " + st.line.Detail
	}
	st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: o}
	st.change = func() error {
		if disable {
			if err := r.init.SetEnabled(r.ctx, unit, false); err != nil {
				return err
			}
		}
		if stop {
			return r.init.Stop(r.ctx, unit)
		}
		return nil
	}
	st.readback = func() (*store.Entry, error) {
		got, err := r.init.State(r.ctx, unit)
		if err != nil {
			return nil, err
		}
		if (stop && got.Running) || (disable && got.IsEnabled()) {
			return nil, fmt.Errorf("%s is %s, not as it was found", unit, describeState(got))
		}
		return nil, nil
	}
}

func init() {
	registerAlone(shapes.TypeService, (*run).service, func(r *run, st *step) {
		e := st.entry
		if err := r.connectInit(); err != nil && e.Original != nil {
			st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot give the unit back: "+err.Error(), false
			return
		}
		r.planServiceRemoval(st)
	})
}
