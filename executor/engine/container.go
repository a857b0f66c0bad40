package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/dockerapi"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// A container runs through the runtime found on the machine, spoken to
// over its Docker-compatible Engine API socket (executor/dockerapi: the
// executor links no HTTP client that could leave the machine). Its image
// is pinned by digest (shapes refuses any other) and pulled by that digest.
//
// A runtime normalises what it is given (defaults filled in, ports and
// environment reordered, the image resolved to an id), so the container's
// own settings cannot be compared with the declaration. Instead the host
// labels every container it makes with the digest of the normalised
// declared spec (specLabel): the same label is the same declaration, a
// different one is a changed declaration and the container is replaced,
// and a missing or stopped one with the declaration's label is drift,
// repaired. Read back by inspecting it: running, labelled, from the image
// the digest names.
//
// Only a container carrying the host's label is ever removed or replaced.
// One found by name without it is held on an adopted node (reported held,
// never changed or removed) until its module is taken; anywhere else the
// step fails and names it, since it is somebody's. Once its module is
// taken it is set aside (stopped, renamed) for the host's own, and the
// intent before that names it, so a kill at any instant of the take-over
// still leaves the record that gives it back.

// specLabel carries the digest of the declared spec a container was made
// from; its presence is what makes a container the host's.
const specLabel = "nox-mesh-host.spec"

// claimLabel names the resource that made a container, for a person
// reading `podman inspect`.
const claimLabel = "nox-mesh-host.resource"

// stopTimeout is how long a container is given to stop before it is
// killed, as Docker's own default.
const stopTimeout = 10

// pullTimeout bounds one image pull.
const pullTimeout = 10 * time.Minute

// runtimeSockets are where the runtime is looked for; the profile's
// container-runtime capability tries the same ones.
var runtimeSockets = dockerapi.Sockets

// findRuntime returns a client for the first socket that answers _ping,
// or an error that says this host cannot apply shape and why, naming
// every socket tried.
func findRuntime(ctx context.Context, shape string) (*dockerapi.Client, error) {
	var tried []string
	for _, s := range runtimeSockets {
		c := &dockerapi.Client{Socket: s, Timeout: 2 * time.Minute}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Ping(pctx)
		cancel()
		if err == nil {
			return c, nil
		}
		why := err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			why = "absent"
		}
		tried = append(tried, s+": "+why)
	}
	return nil, fmt.Errorf("this host cannot apply '%s': no container runtime answered _ping (%s)", shape, strings.Join(tried, "; "))
}

// containerSpec is the normalised declared spec: what the label's digest
// is taken over. Environment as sorted KEY=VALUE, ports and mounts sorted,
// so two declarations saying the same thing in another order are one.
type containerSpec struct {
	Name    string   `json:"name"`
	Image   string   `json:"image"`
	Command []string `json:"command"`
	Env     []string `json:"env"`
	Ports   []string `json:"ports"`
	Mounts  []string `json:"mounts"`
	Network string   `json:"network"`
}

func specOf(c *shapes.Container) containerSpec {
	s := containerSpec{Name: c.Name, Image: c.Image, Command: c.Command, Network: c.Network,
		Ports: slices.Sorted(slices.Values(c.Ports)), Mounts: slices.Sorted(slices.Values(c.Mounts))}
	for k, v := range c.Env {
		s.Env = append(s.Env, k+"="+v)
	}
	slices.Sort(s.Env)
	return s
}

func (s containerSpec) digest() string {
	b, _ := json.Marshal(s) // plain strings and slices: cannot fail
	return "sha256:" + digest(b)
}

// createBody is the Engine API's container create request, as far as a
// declaration says anything.
func (s containerSpec) createBody(labels map[string]string) (map[string]any, error) {
	body := map[string]any{"Image": s.Image, "Labels": labels}
	if len(s.Command) > 0 {
		body["Cmd"] = s.Command
	}
	if len(s.Env) > 0 {
		body["Env"] = s.Env
	}
	hc := map[string]any{}
	if len(s.Ports) > 0 {
		exposed := map[string]struct{}{}
		bindings := map[string][]map[string]string{}
		for _, p := range s.Ports {
			ip, host, ctr, ok := shapes.ParsePort(p)
			if !ok {
				return nil, fmt.Errorf("ports: %q is not \"[ip:]host:container[/tcp|udp]\"", p)
			}
			proto := "tcp"
			if _, pr, ok := strings.Cut(p, "/"); ok {
				proto = pr
			}
			key := strconv.Itoa(ctr) + "/" + proto
			exposed[key] = struct{}{}
			bindings[key] = append(bindings[key], map[string]string{"HostIp": ip, "HostPort": strconv.Itoa(host)})
		}
		body["ExposedPorts"] = exposed
		hc["PortBindings"] = bindings
	}
	if len(s.Mounts) > 0 {
		hc["Binds"] = s.Mounts
	}
	if s.Network != "" {
		hc["NetworkMode"] = s.Network
	}
	body["HostConfig"] = hc
	return body, nil
}

// inspected is what the host reads back of a container.
type inspected struct {
	ID    string `json:"Id"`
	Image string `json:"Image"`
	State struct {
		Running bool   `json:"Running"`
		Status  string `json:"Status"`
	} `json:"State"`
	Config struct {
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
}

func (i *inspected) label() string { return i.Config.Labels[specLabel] }

// heldSig says what a held container was found as: which one (a container
// made anew under the same name is another), its image, whether it ran.
func heldSig(i inspected) string {
	return fmt.Sprintf("found %s image %s running=%v", short12(strings.TrimPrefix(i.ID, "sha256:")), short12(strings.TrimPrefix(i.Image, "sha256:")), i.State.Running)
}

// imagePath is an API path naming an image reference: its slashes are the
// route's own (the Engine API takes {name:.*}).
func imagePath(ref, rest string) string {
	return dockerapi.Path(nil, "images") + "/" + strings.ReplaceAll(url.PathEscape(ref), "%2F", "/") + rest
}

// inspectContainer reads a container by name; found is false on a 404.
func inspectContainer(ctx context.Context, rt *dockerapi.Client, name string) (cur inspected, found bool, err error) {
	err = rt.Do(ctx, "GET", dockerapi.Path(nil, "containers", name, "json"), nil, &cur)
	if dockerapi.IsNotFound(err) {
		return cur, false, nil
	}
	if err != nil {
		return cur, false, fmt.Errorf("inspect container %s: %w", name, err)
	}
	return cur, true, nil
}

// ensureImage returns the id of the image ref names, pulling it by its
// digest first when the runtime does not have it.
func ensureImage(ctx context.Context, rt *dockerapi.Client, ref string) (id string, pulled bool, err error) {
	var img struct {
		ID string `json:"Id"`
	}
	err = rt.Do(ctx, "GET", imagePath(ref, "/json"), nil, &img)
	if err == nil {
		return img.ID, false, nil
	}
	if !dockerapi.IsNotFound(err) {
		return "", false, fmt.Errorf("inspect image %s: %w", ref, err)
	}
	pctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	puller := &dockerapi.Client{Socket: rt.Socket}
	var failed string
	err = puller.Stream(pctx, "POST", dockerapi.Path(url.Values{"fromImage": {ref}}, "images", "create"), nil, 64<<20, func(m json.RawMessage) error {
		var p struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(m, &p) == nil && p.Error != "" {
			failed = p.Error
		}
		return nil
	})
	if err == nil && failed != "" {
		err = errors.New(failed)
	}
	if err != nil {
		return "", false, fmt.Errorf("pull %s: %w", ref, err)
	}
	if err := rt.Do(ctx, "GET", imagePath(ref, "/json"), nil, &img); err != nil {
		return "", false, fmt.Errorf("read back the pulled image %s: %w", ref, err)
	}
	return img.ID, true, nil
}

// stopAndRemove stops a container (killed after stopTimeout) and removes
// it; one already gone is not an error.
func stopAndRemove(ctx context.Context, rt *dockerapi.Client, name string) error {
	q := url.Values{"t": {strconv.Itoa(stopTimeout)}}
	if err := rt.Do(ctx, "POST", dockerapi.Path(q, "containers", name, "stop"), nil, nil); err != nil && !dockerapi.IsNotFound(err) {
		return fmt.Errorf("stop container %s: %w", name, err)
	}
	if err := rt.Do(ctx, "DELETE", dockerapi.Path(url.Values{"force": {"true"}}, "containers", name), nil, nil); err != nil && !dockerapi.IsNotFound(err) {
		return fmt.Errorf("remove container %s: %w", name, err)
	}
	return nil
}

func sameImage(a, b string) bool {
	return strings.TrimPrefix(a, "sha256:") == strings.TrimPrefix(b, "sha256:")
}

func short12(s string) string {
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// container observes a container by name, makes, starts or replaces it
// when it differs from the declaration, and reads it back.
func (r *run) container(st *step, rest int) {
	c := st.res.(*shapes.Container)
	e := r.settle(r.st.Get(st.target), st.claim)
	if r.yieldAlone(st, e, rest) {
		return
	}
	rt, err := findRuntime(r.ctx, shapes.TypeContainer)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	spec := specOf(c)
	want := spec.digest()
	cur, found, err := inspectContainer(r.ctx, rt, c.Name)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	n := &store.Entry{Target: st.target, Type: shapes.TypeContainer, Claims: withClaim(e, st.claim), Digest: want, Created: true}
	if e != nil {
		n.Order = e.Order
		if !e.Held {
			n.Original = e.Original // a container set aside when taken over
		}
	}
	ours := found && cur.label() != ""
	if !found && r.heldGone(st, e, c.Module, c.Key(), "removed") {
		r.recordAndEmit(st, rest)
		return
	}
	if found && !ours {
		if r.holds(c.Module, e) {
			// Held: found on an adopted node, its module not yet taken.
			// What was found is remembered (which container, its image,
			// whether it ran), so a change by something else is seen.
			r.heldOK[c.Key()] = false // nothing proves it runs what is declared
			n.Held, n.Digest, n.Created = true, heldSig(cur), false
			st.line.Outcome = shapes.Held
			st.line.Detail = fmt.Sprintf("found on an adopted node (%s, no %s label); held as found until module %s is taken", cur.State.Status, specLabel, c.Module)
			if e != nil && e.Held {
				n.Digest = e.Digest // what was found first, kept
				if e.Digest != "" && e.Digest != heldSig(cur) {
					st.line.Outcome = shapes.HeldChanged
					st.line.Detail = fmt.Sprintf("held until module %s is taken, and changed by something else since it was found (%s; now %s); left as it is", c.Module, e.Digest, heldSig(cur))
				}
			}
			if !r.opt.Plan && (e == nil || !e.Claimed(st.claim) || e.Digest == "") {
				if err := r.st.Put(n); err != nil {
					r.fail(st, err, rest)
					return
				}
			}
			r.emit(st.line)
			return
		}
		if !r.d.Adopted {
			r.fail(st, fmt.Errorf("a container named %s exists that the host did not make (no %s label); not touched", c.Name, specLabel), rest)
			return
		}
		// Adopted and its module taken: it converges, replaced by the
		// host's own.
	}
	var action string
	switch {
	case ours && cur.label() == want && cur.State.Running:
		st.line.Outcome = shapes.Unchanged
		st.line.Detail = fmt.Sprintf("running, labelled %s=%s", specLabel, short12(want))
		r.asDeclared(st, e, n, e != nil && e.Held, rest)
		return
	case ours && cur.label() == want:
		action = "start"
		st.line.Detail = fmt.Sprintf("found %s; started", cur.State.Status)
	case found:
		action = "replace"
		st.line.Detail = "the declaration changed (label " + short12(cur.label()) + ", declared " + short12(want) + "); replaced"
		if !ours {
			st.line.Detail = "found without the host's label on an adopted node whose module is taken; replaced"
		}
	default:
		action = "create"
		st.line.Detail = "created and started"
		if e != nil && e.Digest == want {
			st.line.Detail = "gone; created and started again"
		}
	}
	st.line.Outcome = changedOutcome(e, n)
	if r.opt.Plan {
		st.line.Detail = "would be " + strings.TrimPrefix(st.line.Detail, "found "+cur.State.Status+"; ")
		r.emit(st.line)
		return
	}
	takeOver := action == "replace" && !ours
	if takeOver {
		// What is needed to give the found container back (which one, and
		// whether it ran; its name is the target's) goes into the intent,
		// durable before it is stopped or renamed: killed at any instant
		// after this, the next apply or undeclare finds it in the record
		// and can still give it back, rather than losing it under the
		// aside name.
		o := &store.Original{Kind: shapes.TypeContainer, Digest: cur.ID, Running: cur.State.Running}
		if p := n.Original; p != nil && p.Kind == shapes.TypeContainer && p.Digest == cur.ID {
			o.Running = p.Running // an interrupted take-over stopped it: as it was found then
		}
		n.Original = o
		if e != nil && e.Held {
			// No longer held: its module is taken and the host is about to
			// change it. Recorded first, so that what an interrupted
			// take-over leaves is the host's to give back on undeclare
			// (a held entry is only ever forgotten), and the host's own
			// rename is never read as "removed by something else".
			taken := *e
			taken.Held, taken.Digest, taken.Claims, taken.Pending = false, "", withClaim(e, st.claim), nil
			if err := r.st.Put(&taken); err != nil {
				r.fail(st, err, rest)
				return
			}
		}
	}
	// Every intent carries the container set aside, if any: a later
	// interrupted step must not lose it either.
	if !r.intendNow(st, store.Intent{Op: action, Claim: st.claim, Type: shapes.TypeContainer, Created: true, Original: n.Original}, rest) {
		return
	}
	imageID, pulled, err := ensureImage(r.ctx, rt, c.Image)
	if err != nil {
		r.fail(st, err, rest)
		return
	}
	if takeOver {
		// Taken over on an adopted node: the container found is not the
		// host's to destroy. It is stopped and set aside under another
		// name, whole (its image, configuration and data as they are);
		// undeclaring gives it back.
		if err := setAside(r.ctx, rt, cur.ID, aside(c.Name)); err != nil {
			r.fail(st, err, rest)
			return
		}
		st.line.Detail = fmt.Sprintf("found without the host's label on an adopted node whose module is taken; set aside, stopped, as %s (given back when this is undeclared), and replaced", aside(c.Name))
	} else if action == "replace" {
		if err := stopAndRemove(r.ctx, rt, c.Name); err != nil {
			r.fail(st, err, rest)
			return
		}
	}
	if action != "start" {
		body, err := spec.createBody(map[string]string{specLabel: want, claimLabel: st.claim.Key()})
		if err != nil {
			r.fail(st, err, rest)
			return
		}
		if err := rt.Do(r.ctx, "POST", dockerapi.Path(url.Values{"name": {c.Name}}, "containers", "create"), body, &struct{}{}); err != nil {
			r.fail(st, fmt.Errorf("create container %s: %w", c.Name, err), rest)
			return
		}
	}
	if err := rt.Do(r.ctx, "POST", dockerapi.Path(nil, "containers", c.Name, "start"), nil, nil); err != nil {
		r.fail(st, fmt.Errorf("start container %s: %w", c.Name, err), rest)
		return
	}
	got, found, err := inspectContainer(r.ctx, rt, c.Name)
	switch {
	case err != nil:
	case !found:
		err = fmt.Errorf("container %s is gone", c.Name)
	case got.label() != want:
		err = fmt.Errorf("container %s is labelled %q, not %q", c.Name, got.label(), want)
	case !sameImage(got.Image, imageID):
		err = fmt.Errorf("container %s runs image %s, not %s", c.Name, short12(got.Image), short12(imageID))
	case !got.State.Running:
		err = fmt.Errorf("container %s is %s, not running", c.Name, got.State.Status)
	}
	if err != nil {
		r.fail(st, fmt.Errorf("read back: %w", err), rest)
		return
	}
	if pulled {
		st.line.Detail += "; pulled " + c.Image
	}
	st.line.Detail += fmt.Sprintf("; image %s, labelled %s=%s", short12(imageID), specLabel, short12(want))
	if err := r.st.Put(n); err != nil {
		r.fail(st, err, rest)
		return
	}
	r.emit(st.line)
}

// removeContainer stops and removes an undeclared container, only if it
// carries the host's label.
func (r *run) removeContainer(st *step) {
	name := strings.TrimPrefix(st.entry.Target, "container:")
	st.drop = true
	rt, err := findRuntime(r.ctx, shapes.TypeContainer)
	if err != nil {
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, "cannot remove the container: "+err.Error(), false
		return
	}
	cur, found, err := inspectContainer(r.ctx, rt, name)
	o := st.entry.Original
	if o != nil && o.Kind != shapes.TypeContainer {
		o = nil
	}
	if err == nil && o != nil && !(found && cur.ID == o.Digest) {
		// The container found before the mesh, set aside: gone since (by
		// something else), there is nothing to give back.
		var there bool
		if _, there, err = inspectContainer(r.ctx, rt, o.Digest); err == nil && !there {
			o = nil
		}
	}
	switch {
	case err != nil:
		st.line.Outcome, st.line.Detail, st.drop = shapes.Failed, err.Error(), false
		return
	case !found && o == nil:
		st.line.Outcome, st.line.Detail = shapes.Removed, "container "+name+" is gone already"
		return
	case found && cur.label() == "" && o != nil && cur.ID == o.Digest:
		// A take-over interrupted before the rename: the found container
		// is still under its name, perhaps stopped by the host.
		r.restartFound(st, rt, name, cur, o)
		return
	case found && cur.label() == "":
		st.line.Outcome, st.line.Detail = shapes.Forgotten, fmt.Sprintf("container %s does not carry the host's %s label: not the host's to remove; left as it is", name, specLabel)
		return
	}
	st.line.Outcome, st.line.Detail = shapes.Removed, "container "+name+" stopped and removed"
	if o != nil {
		st.line.Outcome = shapes.Restored
		st.line.Detail += fmt.Sprintf("; the container found here before the mesh took it over is given back (%s renamed %s%s)", aside(name), name, map[bool]string{true: ", started again", false: ", left stopped as it was found"}[o.Running])
	}
	if r.opt.Plan {
		st.line.Detail = strings.Replace(st.line.Detail, "container "+name+" stopped and removed", "container "+name+" would be stopped and removed", 1)
		return
	}
	st.intent = &store.Intent{Op: "remove", Type: shapes.TypeContainer, Claim: firstClaim(st.entry), Original: o}
	st.change = func() error {
		if err := stopAndRemove(r.ctx, rt, name); err != nil {
			return err
		}
		if o == nil {
			return nil
		}
		return giveBackAside(r.ctx, rt, o.Digest, name, o.Running)
	}
	st.readback = func() (*store.Entry, error) {
		got, found, err := inspectContainer(r.ctx, rt, name)
		switch {
		case err != nil:
			return nil, err
		case o != nil:
			if !found || got.ID != o.Digest || got.State.Running != o.Running {
				return nil, fmt.Errorf("container %s is not the one found before the mesh, as it was found (running=%v)", name, o.Running)
			}
		case found:
			return nil, fmt.Errorf("container %s is still there", name)
		}
		return nil, nil
	}
}

// restartFound ends the undeclare of a take-over interrupted before the
// found container was renamed: it is under its own name, never the host's
// to remove, and is given back as it was found — started again if it ran
// and the host had stopped it, otherwise left as it is.
func (r *run) restartFound(st *step, rt *dockerapi.Client, name string, cur inspected, o *store.Original) {
	if !o.Running || cur.State.Running {
		st.line.Outcome, st.line.Detail = shapes.Forgotten, fmt.Sprintf("container %s is the one found here before the mesh, never set aside (the take-over was interrupted); not the host's to remove; left as it is", name)
		return
	}
	st.line.Outcome, st.line.Detail = shapes.Restored, fmt.Sprintf("container %s, the one found here before the mesh, was stopped by a take-over that was interrupted; started again, as it was found", name)
	if r.opt.Plan {
		st.line.Detail = strings.Replace(st.line.Detail, "; started again", "; would be started again", 1)
		return
	}
	st.intent = &store.Intent{Op: "restore", Type: shapes.TypeContainer, Claim: firstClaim(st.entry), Original: o}
	st.change = func() error {
		if err := rt.Do(r.ctx, "POST", dockerapi.Path(nil, "containers", o.Digest, "start"), nil, nil); err != nil {
			return fmt.Errorf("give back container %s: start: %w", name, err)
		}
		return nil
	}
	st.readback = func() (*store.Entry, error) {
		got, found, err := inspectContainer(r.ctx, rt, name)
		switch {
		case err != nil:
			return nil, err
		case !found || got.ID != o.Digest || !got.State.Running:
			return nil, fmt.Errorf("container %s is not the one found before the mesh, running as it was found", name)
		}
		return nil, nil
	}
}

// aside is the name a container found on an adopted node is kept under
// while the host's own runs under its name.
func aside(name string) string { return name + "-found-by-mesh" }

// setAside stops the container id and renames it to name.
func setAside(ctx context.Context, rt *dockerapi.Client, id, name string) error {
	q := url.Values{"t": {strconv.Itoa(stopTimeout)}}
	if err := rt.Do(ctx, "POST", dockerapi.Path(q, "containers", id, "stop"), nil, nil); err != nil && !dockerapi.IsNotFound(err) {
		return fmt.Errorf("set aside container %s: stop: %w", short12(id), err)
	}
	if err := rt.Do(ctx, "POST", dockerapi.Path(url.Values{"name": {name}}, "containers", id, "rename"), nil, nil); err != nil {
		return fmt.Errorf("set aside container %s as %s: %w", short12(id), name, err)
	}
	return nil
}

// giveBackAside renames the container id set aside back to name, and
// starts it if it ran when it was found.
func giveBackAside(ctx context.Context, rt *dockerapi.Client, id, name string, running bool) error {
	if err := rt.Do(ctx, "POST", dockerapi.Path(url.Values{"name": {name}}, "containers", id, "rename"), nil, nil); err != nil {
		return fmt.Errorf("give back container %s as %s: %w", short12(id), name, err)
	}
	if running {
		if err := rt.Do(ctx, "POST", dockerapi.Path(nil, "containers", name, "start"), nil, nil); err != nil {
			return fmt.Errorf("give back container %s: start: %w", name, err)
		}
	}
	return nil
}

func init() {
	registerAlone(shapes.TypeContainer, (*run).container, (*run).removeContainer)
}

// readyFor is, per shape, what must answer on this machine before a
// declaration naming that shape is accepted: without it the declaration is
// refused whole, before anything is touched, rather than failing half-way.
var readyFor = map[string]func(r *run) error{
	shapes.TypeContainer: func(r *run) error { _, err := findRuntime(r.ctx, shapes.TypeContainer); return err },
	shapes.TypeNetwork:   func(r *run) error { _, err := findRuntime(r.ctx, shapes.TypeNetwork); return err },
}
