package engine

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/initsys"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A process is the mesh's own long-running program, defined under the
// init the machine has (initsys.Define: a systemd unit with hardening
// defaults, an OpenRC script under supervise-daemon, a runit or s6 service
// directory), enabled and started, and read back running — the init says
// so, and a process with exactly the declared command line runs as the
// declared user (its real and effective uid, from /proc). The definition
// is the host's creation, written root's and atomically: a definition
// edited by hand is put back and the program restarted onto it, a program
// stopped by hand is started (both repaired). Undeclared: stopped, taken
// out of the init's supervision, its definition removed. A name that is a
// unit the mesh did not create is refused by name before anything is
// touched (check, below).

func init() {
	registerAlone(shapes.TypeProcess, (*run).process, (*run).removeProcess)
	readyFor[shapes.TypeProcess] = func(r *run) error {
		if err := r.connectInit(); err != nil {
			return fmt.Errorf("a process is defined under the machine's init: %w", err)
		}
		return nil
	}
}

// processTarget is a process's target: the unit it is.
func processTarget(name string) string { return "service:" + shapes.NormaliseUnit(name) }

// checkProcesses refuses a process whose name is a unit the mesh did not
// create, and a service whose unit is one the mesh made for a process,
// before anything is touched. A service takes a unit over as one the host
// found (its record of what the unit was): over a process's, it would
// drop what the mesh made — the unit's definition, left behind when the
// process goes, and the process then refused as a unit the mesh did not
// create.
func (r *run) checkProcesses() error {
	declared := map[string]bool{}
	for _, res := range r.d.Resources {
		declared[shapes.Target(res)] = true
	}
	for _, res := range r.d.Resources {
		svc, ok := res.(*shapes.Service)
		if !ok {
			continue
		}
		// A unit defined by a file the host made for this source, which
		// the declaration no longer declares: its removal, later in the
		// apply, would leave the unit running with no definition (and
		// every later apply saying it gone "since").
		if def, e := r.unitFileMade(shapes.NormaliseUnit(svc.Unit)); e != nil && !declared["path:"+def] && r.thisSourceOnly(e) {
			return &Refusal{fmt.Sprintf("resource %s field unit: %s is defined by %s, a file the host made for %s, which this declaration no longer declares: removed, it would leave the unit with no definition; declare the file still, or undeclare the service with it", svc.Key(), shapes.NormaliseUnit(svc.Unit), def, firstClaim(e).Key())}
		}
		if e := r.st.Get(shapes.Target(svc)); e != nil && (e.Type == shapes.TypeProcess || e.Pending != nil && e.Pending.Type == shapes.TypeProcess) {
			by := ""
			if len(e.Claims) > 0 {
				by = " " + e.Claims[0].Key()
			}
			return &Refusal{fmt.Sprintf("resource %s field unit: %s is the unit the mesh made for process%s; a service never takes over a process's unit (declare the process, with the state wanted, instead)", svc.Key(), strings.TrimPrefix(e.Target, "service:"), by)}
		}
	}
	for _, res := range r.d.Resources {
		p, ok := res.(*shapes.Process)
		if !ok {
			continue
		}
		if err := r.connectInit(); err != nil {
			return &Refusal{fmt.Sprintf("resource %s: %v", p.Key(), err)}
		}
		cur, err := r.init.State(r.ctx, shapes.NormaliseUnit(p.Name))
		if err != nil {
			return &Refusal{fmt.Sprintf("resource %s: %v", p.Key(), err)}
		}
		e := r.st.Get(processTarget(p.Name))
		ours := e != nil && (e.Type == shapes.TypeProcess || e.Pending != nil && e.Pending.Type == shapes.TypeProcess)
		if cur.Known && !ours {
			if def, e := r.unitFileMade(shapes.NormaliseUnit(p.Name)); e != nil {
				// The mesh wrote it, as a file: still a unit the process
				// would take over, which it never does.
				return &Refusal{fmt.Sprintf("resource %s field name: %s already knows a unit %q, defined by %s, a file the host made for %s; a process never takes over a unit: apply a declaration without that file (and any service of the unit) first, then the process", p.Key(), r.init.Name(), cur.Name, def, firstClaim(e).Key())}
			}
			return &Refusal{fmt.Sprintf("resource %s field name: %s already knows a unit %q, which the mesh did not create; a process never takes over a unit (declare it as a service instead, or name the process otherwise)", p.Key(), r.init.Name(), cur.Name)}
		}
	}
	return nil
}

// unitFileMade is the file resource's record the host made at one of
// unit's definitions, and that definition's path; nil when none is.
func (r *run) unitFileMade(unit string) (string, *store.Entry) {
	for _, def := range unitDefinitions(unit) {
		if e := r.st.Get("path:" + def); e != nil && e.Type == shapes.TypeFile && e.Created {
			return def, e
		}
	}
	return "", nil
}

// program is p as initsys defines it.
func program(p *shapes.Process) initsys.Program {
	prog := initsys.Program{Name: p.Name, Exec: p.Exec, User: p.User, Description: p.Key()}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		prog.Env = append(prog.Env, [2]string{k, p.Env[k]})
	}
	return prog
}

// processStartWithin is how long a started program has to show in /proc
// as the declared user (runit takes a new service over within 5 s).
const processStartWithin = 20 * time.Second

func (r *run) process(st *step, rest int) {
	p := st.res.(*shapes.Process)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	if err := r.connectInit(); err != nil {
		r.fail(st, err, rest)
		return
	}
	ow, err := newOwners(r.opt.getent).resolve(p.User)
	if err != nil {
		r.fail(st, fmt.Errorf("user %s: %w (declare it with a user resource before the process)", p.User, err), rest)
		return
	}
	if ow.uid == 0 {
		r.fail(st, fmt.Errorf("user %s is uid 0: a process the mesh runs is never root", p.User), rest)
		return
	}
	if fi, err := os.Stat(p.Exec[0]); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		r.fail(st, fmt.Errorf("the program %s is not an executable file here (%v); an archive or package declared before it brings it", p.Exec[0], err), rest)
		return
	}
	def, err := initsys.Define(r.init.Name(), initsys.ScanDir(r.init), program(p))
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	// Observe: the definition's files as written, the unit's state.
	var stale []initsys.DefFile
	var missingDirs []string
	for _, d := range def.Dirs {
		if info, err := fsx.Lstat(d); err != nil || info.Kind != fsx.Dir {
			missingDirs = append(missingDirs, d)
		}
	}
	var all bytes.Buffer
	for _, f := range def.Files {
		fmt.Fprintf(&all, "%s %o\n%s\n", f.Path, f.Mode, f.Content)
		eq, info, err := fsx.Equal(f.Path, []byte(f.Content))
		if err != nil && info.Kind != fsx.Absent {
			r.fail(st, err, rest)
			return
		}
		if !eq || info.Mode != f.Mode || info.UID != 0 || info.GID != 0 {
			stale = append(stale, f)
		}
	}
	fmt.Fprintf(&all, "running=%v\n", p.Running())
	cur, err := r.init.State(r.ctx, def.Unit)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	want := p.Running()
	n := &store.Entry{Target: st.target, Type: shapes.TypeProcess, Claims: withClaim(e, st.claim), Digest: digest(all.Bytes()), Created: true, Paths: def.Paths()}
	if e != nil {
		n.Order = e.Order
	}
	runsAs := !want || cur.Running && r.runsAs(p.Exec, ow.uid, 0) == nil
	if len(stale) == 0 && len(missingDirs) == 0 && cur.Known && cur.IsEnabled() == want && cur.Running == want && runsAs {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("%s defined under %s, %s", def.Unit, r.init.Name(), map[bool]string{true: "running as " + p.User, false: "stopped"}[want])
		r.asDeclared(st, e, n, false, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	var did []string
	switch {
	case !cur.Known || len(missingDirs) > 0:
		did = append(did, "defined under "+r.init.Name())
	case len(stale) > 0:
		did = append(did, "its definition put back")
	}
	if cur.IsEnabled() != want {
		did = append(did, map[bool]string{true: "enabled", false: "disabled"}[want])
	}
	switch {
	case want && !cur.Running:
		did = append(did, "started as "+p.User)
	case want && len(stale) > 0:
		did = append(did, "restarted onto it")
	case !want && cur.Running:
		did = append(did, "stopped")
	}
	st.line.Detail = def.Unit + ": " + strings.Join(did, ", ")
	if r.opt.Plan {
		st.line.Detail = "would be " + st.line.Detail
		r.emit(st.line)
		return
	}
	if !r.intendNow(st, store.Intent{Op: "create", Claim: st.claim, Type: shapes.TypeProcess, Created: !cur.Known, Paths: def.Paths()}, rest) {
		return
	}
	if err := r.defineProcess(def, missingDirs, stale); err != nil {
		r.fail(st, err, rest)
		return
	}
	if err := r.driveProcess(def.Unit, cur, want, len(stale) > 0); err != nil {
		r.fail(st, fmt.Errorf("%s: %w", def.Unit, err), rest)
		return
	}
	// Read back: the init's word, and the program itself as the user.
	got, err := r.init.State(r.ctx, def.Unit)
	switch {
	case err != nil:
	case got.Running != want:
		err = fmt.Errorf("%s says the unit is %s", r.init.Name(), map[bool]string{true: "running", false: "stopped"}[got.Running])
	case want:
		err = r.runsAs(p.Exec, ow.uid, processStartWithin)
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back %s: %w", def.Unit, err), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// defineProcess makes the definition's directories and writes its stale
// files, root's, atomically and synced; systemd then reads them again.
func (r *run) defineProcess(def initsys.Definition, dirs []string, files []initsys.DefFile) error {
	for _, d := range dirs {
		if err := fsx.Mkdir(d, 0o755, 0, 0); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := fsx.WriteFile(f.Path, []byte(f.Content), fsx.WriteOptions{Mode: f.Mode, Sync: true}); err != nil {
			return err
		}
	}
	if len(dirs)+len(files) > 0 {
		if err := fsx.Syncfs(filepath.Dir(def.Paths()[0])); err != nil {
			return err
		}
		return r.init.Reload(r.ctx)
	}
	return nil
}

// driveProcess brings the unit to the declared state: enabled at boot
// when it runs, started (restarted onto a definition put back) or
// stopped.
func (r *run) driveProcess(unit string, cur initsys.State, want, redefined bool) error {
	if cur.IsEnabled() != want || !cur.Known {
		if err := r.init.SetEnabled(r.ctx, unit, want); err != nil {
			return err
		}
	}
	switch {
	case want && !cur.Running:
		return r.init.Start(r.ctx, unit)
	case want && redefined:
		return r.init.Restart(r.ctx, unit)
	case !want && cur.Running:
		return r.init.Stop(r.ctx, unit)
	}
	return nil
}

// runsAs waits up to within for a process whose command line is exec's
// (cmdlinesOf) and whose real and effective uid are uid.
func (r *run) runsAs(exec []string, uid int, within time.Duration) error {
	want := cmdlinesOf(exec)
	deadline := clock.Deadline(within)
	for {
		found, err := findProcess(want...)
		if err != nil {
			return err
		}
		for _, ids := range found {
			if ids[0] == uid && ids[1] == uid {
				return nil
			}
		}
		if clock.Past(deadline) {
			if len(found) > 0 {
				return fmt.Errorf("%s runs, but as uid %v, not %d", exec[0], found, uid)
			}
			return fmt.Errorf("no process runs %s as declared", strings.Join(exec, " "))
		}
		select {
		case <-r.ctx.Done():
			return r.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cmdlinesOf is the command lines (/proc/PID/cmdline's bytes) a process
// started from exec shows: exec itself; and, exec[0] a script ("#!"), the
// one the kernel gives it — its interpreter, the interpreter's one
// argument if the line names one, the script's path, then the rest of
// exec — which is what runs.
func cmdlinesOf(exec []string) [][]byte {
	join := func(argv []string) []byte { return []byte(strings.Join(argv, "\x00") + "\x00") }
	out := [][]byte{join(exec)}
	// Read as root from a path the process's user may be able to write:
	// no link followed, a FIFO or a device refused (fsx.ReadHead). The
	// kernel reads no more of it than 256 bytes (BINPRM_BUF_SIZE).
	head, err := fsx.ReadHead(exec[0], 256)
	if err != nil {
		return out
	}
	line, ok := bytes.CutPrefix(head, []byte("#!"))
	if !ok {
		return out
	}
	line, _, _ = bytes.Cut(line, []byte("\n"))
	// As the kernel reads it: the interpreter up to a blank, the rest
	// of the line, trimmed, its one argument.
	interp, arg := strings.TrimLeft(string(line), " \t"), ""
	if end := strings.IndexAny(interp, " \t"); end >= 0 {
		interp, arg = interp[:end], strings.Trim(interp[end:], " \t")
	}
	if interp == "" {
		return out
	}
	argv := []string{interp}
	if arg != "" {
		argv = append(argv, arg)
	}
	return append(out, join(append(argv, exec...)))
}

// findProcess lists the real and effective uids of every process whose
// /proc/PID/cmdline is exactly one of cmdlines.
func findProcess(cmdlines ...[]byte) ([][2]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out [][2]int
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !slices.ContainsFunc(cmdlines, func(c []byte) bool { return bytes.Equal(b, c) }) {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "Uid:" {
				real, _ := strconv.Atoi(f[1])
				eff, _ := strconv.Atoi(f[2])
				out = append(out, [2]int{real, eff})
			}
		}
	}
	return out, nil
}

// removeProcess stops an undeclared process, takes it out of the init's
// supervision and removes its definition: the host's own creation.
func (r *run) removeProcess(st *step) {
	e := st.entry
	st.drop = true
	unit := strings.TrimPrefix(e.Target, "service:")
	if err := r.connectInit(); err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot reach the init to stop it: "+err.Error(), false
		return
	}
	cur, err := r.init.State(r.ctx, unit)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	}
	st.line.Outcome = shapes.Removed
	st.line.Detail = fmt.Sprintf("%s stopped and its definition removed (%s)", unit, strings.Join(e.Paths, ", "))
	if r.opt.Plan {
		st.line.Detail = "would be: " + st.line.Detail
	}
	st.intent = &store.Intent{Op: "remove", Type: e.Type, Claim: firstClaim(e)}
	st.change = func() error {
		if cur.Known {
			if cur.Running {
				if err := r.init.Stop(r.ctx, unit); err != nil {
					return err
				}
			}
			if cur.IsEnabled() {
				if err := r.init.SetEnabled(r.ctx, unit, false); err != nil {
					return err
				}
			}
		}
		if err := initsys.Undefine(r.ctx, r.init, strings.TrimSuffix(unit, ".service")); err != nil {
			return err
		}
		for _, p := range e.Paths {
			// The host's own definition (a unit file, a script, a service
			// directory with what its supervisor kept in it).
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
		if err := r.init.Reload(r.ctx); err != nil {
			return err
		}
		return initsys.Forget(r.ctx, r.init)
	}
	st.readback = func() (*store.Entry, error) {
		got, err := r.init.State(r.ctx, unit)
		if err == nil && got.Running {
			err = fmt.Errorf("%s still runs", unit)
		}
		return nil, err
	}
}
