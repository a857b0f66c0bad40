package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
	"github.com/nox-mesh/nox-mesh-host/executor/fsx"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A user is a login: its shell, its home, and groups it is added to. The
// host reads users back through the name service (getent, id), and changes
// them with the shadow tools, which every distribution has and which keep
// the databases' own locking and formats. Groups are added, never pruned:
// the tools replace a user's set unless told to append, and that would
// silently remove every group that lets a login use the machine. A user is
// forgotten, never deleted, when undeclared.
//
// A user the host did not create keeps the shell and home it was found
// with, recorded once (a kept original), the first time the host applies
// it, and undeclaring gives back each of the two the host changed — as a
// unit gets back the state it was found in (ADR 0118). The other way, to
// refuse a found user unless a declaration says to take it over, was not
// taken: on a hardened server the found users are the operator's logins
// and service accounts, a module that sets a login shell or moves a home
// is doing what it was written for, and refusing would only make every
// such module carry an opt-in; what must not happen is that the change
// outlives the module that made it, which the give-back prevents. One the
// operator changed since (its shell or home is no longer what the mesh
// set) is left as the operator has it: that change is theirs. Groups
// added stay: pruning them could cut a login off the machine.

// accounts is the executor's seam to the user databases.
type accounts interface {
	// lookup reads a user; ok is false when there is none.
	lookup(ctx context.Context, name string) (account, bool, error)
	groupExists(ctx context.Context, name string) (bool, error)
	create(ctx context.Context, u *shapes.User) error
	modify(ctx context.Context, name string, shell, home string, addGroups []string) error
}

type account struct {
	Shell, Home string
	Groups      []string // every group, primary included
}

// shadowTools is accounts through getent, id, useradd and usermod.
type shadowTools struct{}

// toolTimeout bounds one of the machine's tools (getent, id, useradd, a
// package manager's query).
const toolTimeout = 2 * time.Minute

// installTimeout bounds a package manager's install: a slow mirror or a
// small board may take long, and an install is stopped gently (its back end
// finishes its transaction; see command.Options.Gentle).
const installTimeout = 30 * time.Minute

// runTool runs one of the machine's tools through executor/command and
// returns its standard output and exit code. A non-zero exit is also an
// error naming argv and the tool's standard error; a caller that takes a
// code for an answer (getent's 2, "no such entry") reads the code first.
func runTool(ctx context.Context, argv ...string) (string, int, error) {
	return runToolEnv(ctx, nil, argv...)
}

// runInstall runs a package manager's install: runTool with extra
// "NAME=value" variables, installTimeout, and a gentle stop.
func runInstall(ctx context.Context, env []string, argv ...string) (string, int, error) {
	return runWith(ctx, command.Options{Timeout: installTimeout, Env: env, Gentle: true}, argv...)
}

func runToolEnv(ctx context.Context, env []string, argv ...string) (string, int, error) {
	return runWith(ctx, command.Options{Timeout: toolTimeout, Env: env}, argv...)
}

func runWith(ctx context.Context, opts command.Options, argv ...string) (string, int, error) {
	res, err := command.Run(ctx, argv, opts)
	if err != nil {
		return "", -1, err
	}
	if res.Code != 0 {
		return res.Stdout, res.Code, fmt.Errorf("running %q failed: exit status %d\n%s", argv, res.Code, res.Stderr)
	}
	return res.Stdout, 0, nil
}

func (shadowTools) lookup(ctx context.Context, name string) (account, bool, error) {
	out, code, err := runTool(ctx, "getent", "passwd", name)
	if code == 2 {
		return account{}, false, nil
	}
	if err != nil {
		return account{}, false, err
	}
	f := strings.Split(strings.TrimSpace(out), ":")
	if len(f) < 7 {
		return account{}, false, fmt.Errorf("getent passwd %s gave %q", name, out)
	}
	groups, _, err := runTool(ctx, "id", "-nG", name)
	if err != nil {
		return account{}, false, err
	}
	return account{Home: f[5], Shell: f[6], Groups: strings.Fields(groups)}, true, nil
}

func (shadowTools) groupExists(ctx context.Context, name string) (bool, error) {
	_, code, err := runTool(ctx, "getent", "group", name)
	if code == 2 {
		return false, nil
	}
	return err == nil, err
}

func (shadowTools) create(ctx context.Context, u *shapes.User) error {
	argv := []string{"useradd", "--user-group"}
	if u.Home != "" {
		argv = append(argv, "--home-dir", u.Home, "--create-home")
	}
	if u.Shell != "" {
		argv = append(argv, "--shell", u.Shell)
	}
	if len(u.Groups) > 0 {
		argv = append(argv, "--groups", strings.Join(u.Groups, ","))
	}
	_, _, err := runTool(ctx, append(argv, "--", u.Name)...)
	return err
}

func (shadowTools) modify(ctx context.Context, name, shell, home string, add []string) error {
	argv := []string{"usermod"}
	if shell != "" {
		argv = append(argv, "--shell", shell)
	}
	if home != "" {
		argv = append(argv, "--home", home) // the home's contents are not moved
	}
	if len(add) > 0 {
		argv = append(argv, "--append", "--groups", strings.Join(add, ","))
	}
	_, _, err := runTool(ctx, append(argv, "--", name)...)
	return err
}

func (r *run) accounts() accounts {
	if r.opt.accounts != nil {
		return r.opt.accounts
	}
	return shadowTools{}
}

// user observes a login, creates or changes it when it differs, and reads
// it back through the name service.
func (r *run) user(st *step, rest int) {
	u := st.res.(*shapes.User)
	acc := r.accounts()
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	cur, exists, err := acc.lookup(r.ctx, u.Name)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	for _, g := range u.Groups {
		ok, err := acc.groupExists(r.ctx, g)
		if err != nil {
			r.fail(st, err, rest)
			return
		}
		if !ok {
			r.fail(st, fmt.Errorf("group %q does not exist; a user is only added to groups the machine has", g), rest)
			return
		}
	}
	var prev string
	if e != nil {
		prev = e.Digest
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeUser, Claims: withClaim(e, st.claim), Digest: recordedUser(u, prev)}
	if e != nil {
		// Found once: later applies never overwrite it. A record with
		// none, of a user the host did not create, is older than the
		// host's keeping it, and none is made up for it: by now the shell
		// and home may be the mesh's doing.
		n.Order, n.Created, n.Original = e.Order, e.Created, e.Original
	}
	if e == nil && exists {
		if n.Original, err = r.keepFoundUser(cur); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	if !exists && r.heldGone(st, e, u.Module, u.Key(), "removed") {
		r.recordAndEmit(st, rest)
		return
	}
	if exists && r.holds(u.Module, e) {
		ok := (u.Shell == "" || u.Shell == cur.Shell) && (u.Home == "" || u.Home == cur.Home)
		for _, g := range u.Groups {
			ok = ok && slices.Contains(cur.Groups, g)
		}
		r.heldOK[u.Key()] = ok
		n.Held, n.Digest = true, ""
		st.line.Outcome, st.line.Detail = shapes.Held, fmt.Sprintf("found on an adopted node; held as found until module %s is taken", u.Module)
		if !r.opt.Plan && (e == nil || !e.Claimed(st.claim)) {
			if err := r.st.Put(n); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
		r.emit(st.line)
		return
	}
	var missing []string
	for _, g := range u.Groups {
		if !slices.Contains(cur.Groups, g) {
			missing = append(missing, g)
		}
	}
	shell := u.Shell
	if shell == cur.Shell {
		shell = ""
	}
	home := u.Home
	if home == cur.Home {
		home = ""
	}
	if exists && shell == "" && home == "" && len(missing) == 0 {
		st.line.Outcome, st.line.Detail = shapes.Unchanged, fmt.Sprintf("shell %s, home %s", cur.Shell, cur.Home)
		r.asDeclared(st, e, n, e != nil && e.Held, rest)
		return
	}
	st.line.Outcome = changedOutcome(e, n)
	switch {
	case !exists:
		st.line.Detail = "created"
		if e != nil && e.Original != nil {
			// Removed by hand since it was found: what the host makes
			// now is its own, and what was found no longer applies.
			r.forget = append(r.forget, e.Original.Digest)
		}
		n.Created, n.Original = true, nil
	default:
		var did []string
		if shell != "" {
			did = append(did, fmt.Sprintf("shell %s → %s", cur.Shell, shell))
		}
		if home != "" {
			did = append(did, fmt.Sprintf("home %s → %s (contents not moved)", cur.Home, home))
		}
		if len(missing) > 0 {
			did = append(did, "added to "+strings.Join(missing, ", "))
		}
		st.line.Detail = strings.Join(did, "; ")
		switch {
		case n.Created || (shell == "" && home == ""):
		case e == nil:
			st.line.Detail += "; the shell and home it was found with are kept, and given back when this is undeclared"
		case n.Original == nil:
			st.line.Detail += "; the shell and home it was first found with are unknown (its record is older than the host's keeping them): undeclaring leaves them as they are"
		}
	}
	// The shadow tools make and chown a home by path. A link on the way to
	// it, or at it, planted by a user who can write a directory above it,
	// would steer them: refuse, as every other write as root does.
	if home := u.Home; home != "" && (!exists || home != cur.Home) {
		info, err := fsx.Lstat(home)
		if err != nil {
			r.fail(st, fmt.Errorf("home %s: %w", home, err), rest)
			return
		}
		if info.Kind != fsx.Absent && info.Kind != fsx.Dir {
			r.fail(st, fmt.Errorf("home %s is a %s; the host makes a home only where nothing, or a directory, is", home, info.Kind), rest)
			return
		}
	}
	if r.opt.Plan {
		r.emit(st.line)
		return
	}
	// The intent carries what the change records once done, for a kill
	// that cuts it before the record (keptOfDigest).
	in := store.Intent{Op: "change", Claim: st.claim, Type: shapes.TypeUser, Created: !exists, Digest: n.Digest}
	if e == nil {
		in.Original = n.Original
	}
	if !r.intendNow(st, in, rest) {
		return
	}
	if !exists {
		err = acc.create(r.ctx, u)
	} else {
		err = acc.modify(r.ctx, u.Name, shell, home, missing)
	}
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	got, ok, err := acc.lookup(r.ctx, u.Name)
	if err == nil && !ok {
		err = fmt.Errorf("the name service does not know %s after it was created", u.Name)
	}
	if err == nil {
		for _, g := range u.Groups {
			if !slices.Contains(got.Groups, g) {
				err = fmt.Errorf("%s is not in group %s after it was added", u.Name, g)
			}
		}
		if (u.Shell != "" && got.Shell != u.Shell) || (u.Home != "" && got.Home != u.Home) {
			err = fmt.Errorf("%s has shell %s and home %s, not what was declared", u.Name, got.Shell, got.Home)
		}
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

func userDigest(u *shapes.User) string {
	g := slices.Clone(u.Groups)
	slices.Sort(g)
	return "shell=" + u.Shell + " home=" + u.Home + " groups=" + strings.Join(g, ",")
}

// foundUser is what the host keeps of a user it found: the two things it
// may change and can give back. Groups are never given back (they are
// added, never pruned).
type foundUser struct {
	Shell string `json:"shell"`
	Home  string `json:"home"`
}

// keepFoundUser keeps a found user's shell and home as a kept original
// (durable before any change is made; not in a plan) and returns the
// record's Original for it.
func (r *run) keepFoundUser(cur account) (*store.Original, error) {
	data, err := json.Marshal(foundUser{Shell: cur.Shell, Home: cur.Home})
	if err != nil {
		return nil, err
	}
	o := &store.Original{Kind: shapes.TypeUser, Digest: digest(data)}
	if !r.opt.Plan {
		if err := r.st.KeepOriginal(o.Digest, data); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// recordedUser is what the entry keeps of a user declaration
// (userDigest) and, for a shell or a home it sets none of, the last one a
// declaration set (was-shell=, was-home=, after the groups, from prev,
// the entry's digest before): a shell the host set under one declaration
// and left under the next is still the host's change, given back when
// the user is undeclared (ADR 0118). A release that reads neither reads
// the rest as before (it reads the digest up to its groups).
func recordedUser(u *shapes.User, prev string) string {
	d := userDigest(u)
	shell, home := declaredUser(prev)
	if u.Shell == "" && shell != "" {
		d += " was-shell=" + shell
	}
	if u.Home == "" && home != "" {
		d += " was-home=" + home
	}
	return d
}

// keptOfUserDigest is what a user's digest keeps through an interrupted
// change (keptOfDigest): the last shell and home a declaration set, as
// carried tokens — never a declaration's own digest, so the change is
// applied again, not taken for a repair.
func keptOfUserDigest(digest string) string {
	if shell, home := declaredUser(digest); shell != "" || home != "" {
		return strings.TrimPrefix(recordedUser(&shapes.User{}, digest), userDigest(&shapes.User{}))
	}
	return ""
}

// declaredUser reads back, from an entry's digest (recordedUser), the
// shell and home the last declaration that set each set ("" for none).
func declaredUser(d string) (shell, home string) {
	d, wasHome, _ := strings.Cut(d, " was-home=")
	d, wasShell, _ := strings.Cut(d, " was-shell=")
	rest, _, _ := strings.Cut(d, " groups=")
	if rest, ok := strings.CutPrefix(rest, "shell="); ok {
		shell, home, _ = strings.Cut(rest, " home=")
	}
	return cmp.Or(shell, wasShell), cmp.Or(home, wasHome)
}

// planUserRemoval gives a found user back the shell and home it was found
// with, each only where the host changed it and it is still what the mesh
// set; a user the host created, or whose found state is unknown, is
// forgotten. Never deleted; its groups stay.
func (r *run) planUserRemoval(st *step) {
	e := st.entry
	name := strings.TrimPrefix(e.Target, "user:")
	st.drop = true
	forgotten := func(why string) {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, why+"; a user is never deleted; its groups stay"
	}
	switch {
	case e.Created:
		forgotten("the host created it")
		return
	case e.Original == nil:
		forgotten("the shell and home it was found with are unknown (its record is older than the host's keeping them); left as it is")
		return
	}
	fail := func(err error) {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot give the user back the shell and home it was found with: "+err.Error(), false
	}
	data, err := r.st.Original(e.Original.Digest)
	var found foundUser
	if err == nil {
		err = json.Unmarshal(data, &found)
	}
	if err != nil {
		fail(err)
		return
	}
	acc := r.accounts()
	cur, ok, err := acc.lookup(r.ctx, name)
	if err != nil {
		fail(err)
		return
	}
	if !ok {
		forgotten("it is gone (removed since); nothing to give back")
		return
	}
	declShell, declHome := declaredUser(e.Digest)
	var shell, home string // what is given back; "" for nothing
	var did, left []string
	give := func(what, declared, now, was string, to *string) {
		switch {
		case declared == "" || now == was:
		case now != declared:
			left = append(left, fmt.Sprintf("the %s is %s, not what the mesh set: left", what, now))
		case was == "":
			left = append(left, fmt.Sprintf("it was found with no %s, which the host cannot give back: left %s", what, now))
		default:
			*to = was
			if what == "home" {
				did = append(did, fmt.Sprintf("home %s → %s (contents not moved)", now, was))
			} else {
				did = append(did, fmt.Sprintf("shell %s → %s", now, was))
			}
		}
	}
	give("shell", declShell, cur.Shell, found.Shell, &shell)
	give("home", declHome, cur.Home, found.Home, &home)
	if len(did) == 0 {
		why := "its shell and home are as it was found"
		if len(left) > 0 {
			why = strings.Join(left, "; ")
		}
		forgotten(why)
		return
	}
	st.line.Outcome = shapes.Restored
	st.line.Detail = strings.Join(did, ", ") + ": given back as the host found it"
	if len(left) > 0 {
		st.line.Detail += "; " + strings.Join(left, "; ")
	}
	st.line.Detail += "; its groups stay"
	if r.opt.Plan {
		st.line.Detail = "would be " + st.line.Detail
	}
	st.intent = &store.Intent{Op: "restore", Type: e.Type, Claim: firstClaim(e), Original: e.Original}
	st.change = func() error { return acc.modify(r.ctx, name, shell, home, nil) }
	st.readback = func() (*store.Entry, error) {
		got, ok, err := acc.lookup(r.ctx, name)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, fmt.Errorf("the name service does not know %s any more", name)
		case (shell != "" && got.Shell != shell) || (home != "" && got.Home != home):
			return nil, fmt.Errorf("%s has shell %s and home %s, not as it was found", name, got.Shell, got.Home)
		}
		return nil, nil
	}
}

func init() {
	registerAlone(shapes.TypeUser, (*run).user, (*run).planUserRemoval)
}
