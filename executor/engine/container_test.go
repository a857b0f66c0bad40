package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/executor/dockerapi"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The label's digest is over the normalised spec: the same declaration in
// another order is the same container; any declared difference is another.
func TestContainerSpecDigest(t *testing.T) {
	img := "r/x@sha256:" + strings.Repeat("a", 64)
	a := &shapes.Container{Name: "c", Image: img, Env: map[string]string{"A": "1", "B": "2"}, Ports: []string{"80:80", "443:443"}, Mounts: []string{"/srv:/srv:ro", "v:/v"}}
	b := &shapes.Container{Name: "c", Image: img, Env: map[string]string{"B": "2", "A": "1"}, Ports: []string{"443:443", "80:80"}, Mounts: []string{"v:/v", "/srv:/srv:ro"}}
	if specOf(a).digest() != specOf(b).digest() {
		t.Fatal("the same declaration in another order has another digest")
	}
	for _, change := range []func(c *shapes.Container){
		func(c *shapes.Container) { c.Env["A"] = "9" },
		func(c *shapes.Container) { c.Command = []string{"/app"} },
		func(c *shapes.Container) { c.Network = "n" },
		func(c *shapes.Container) { c.Ports = c.Ports[:1] },
		func(c *shapes.Container) { c.Image = "r/x@sha256:" + strings.Repeat("b", 64) },
	} {
		c := *b
		c.Env = map[string]string{"A": "1", "B": "2"}
		change(&c)
		if specOf(&c).digest() == specOf(a).digest() {
			t.Fatalf("a changed declaration kept its digest: %+v", c)
		}
	}
}

// What the runtime is asked to create says exactly what was declared.
func TestContainerCreateBody(t *testing.T) {
	c := &shapes.Container{Name: "c", Image: "r/x@sha256:" + strings.Repeat("a", 64), Command: []string{"/app", "-v"},
		Env: map[string]string{"A": "1"}, Ports: []string{"127.0.0.1:8080:80", "53:53/udp"}, Mounts: []string{"/srv:/srv:ro"}, Network: "n"}
	body, err := specOf(c).createBody(map[string]string{specLabel: "d"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(body)
	want := `{"Cmd":["/app","-v"],"Env":["A=1"],"ExposedPorts":{"53/udp":{},"80/tcp":{}},` +
		`"HostConfig":{"Binds":["/srv:/srv:ro"],"NetworkMode":"n","PortBindings":{"53/udp":[{"HostIp":"","HostPort":"53"}],"80/tcp":[{"HostIp":"127.0.0.1","HostPort":"8080"}]}},` +
		`"Image":"r/x@sha256:` + strings.Repeat("a", 64) + `","Labels":{"nox-mesh-host.spec":"d"}}`
	if string(got) != want {
		t.Fatalf("create body\n got %s\nwant %s", got, want)
	}
	if p := imagePath("127.0.0.1:5000/lp/app@sha256:ab", "/json"); p != "/v1.41/images/127.0.0.1:5000/lp/app@sha256:ab/json" {
		t.Fatalf("image path %q", p)
	}
}

// fakeRuntime answers the Engine API on a unix socket, as far as the
// container applier speaks it, holding its containers in memory; the real
// runtime is the lab's (tests/machines runs podman). It can be told to die
// at one request, before or after carrying it out: the store then holds
// exactly what a kill -9 of the executor at that instant leaves (the
// step's intent pending, nothing recorded after it).
type fakeRuntime struct {
	t      *testing.T
	mu     sync.Mutex
	ctrs   []*fakeCtr
	images map[string]string // reference -> image id
	n      int
	// dieAt is "before POST rename", "after POST create" (containers/create),
	// "after DELETE" and so on: the first request it names fails with a 500.
	dieAt string
	// writes are the requests that would change the runtime, in order.
	writes []string
}

type fakeCtr struct {
	id, name, image string
	running         bool
	labels          map[string]string
}

// newFakeRuntime serves a runtime that holds image and nothing else, and
// makes it the only one the engine looks for.
func newFakeRuntime(t *testing.T, image string) *fakeRuntime {
	t.Helper()
	dir, err := os.MkdirTemp("", "rt") // a socket path is short
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRuntime{t: t, images: map[string]string{image: "sha256:" + strings.Repeat("1", 64)}}
	saved := runtimeSockets
	runtimeSockets = []string{sock}
	t.Cleanup(func() { runtimeSockets = saved; l.Close(); os.RemoveAll(dir) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go f.serveConn(c)
		}
	}()
	return f
}

// found makes a container the host did not make, as an operator's.
func (f *fakeRuntime) found(name string, running bool) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range f.images {
		return f.add(name, id, running, nil).id
	}
	return ""
}

func (f *fakeRuntime) add(name, image string, running bool, labels map[string]string) *fakeCtr {
	f.n++
	c := &fakeCtr{id: fmt.Sprintf("%08x", 0xc0ffee00+f.n) + strings.Repeat("0", 56), name: name, image: image, running: running, labels: labels}
	f.ctrs = append(f.ctrs, c)
	return c
}

func (f *fakeRuntime) lookup(ref string) *fakeCtr {
	for _, c := range f.ctrs {
		if c.name == ref || c.id == ref {
			return c
		}
	}
	return nil
}

// state lists every container, sorted: "name id-prefix running=…" for
// one the host did not make, "name (the host's) running=…" for its own.
func (f *fakeRuntime) state() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var s []string
	for _, c := range f.ctrs {
		who := c.id[:8]
		if c.labels[specLabel] != "" {
			who = "(the host's)"
		}
		s = append(s, fmt.Sprintf("%s %s running=%v", c.name, who, c.running))
	}
	sort.Strings(s)
	return strings.Join(s, "; ")
}

func (f *fakeRuntime) serveConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	method, target, _ := strings.Cut(strings.TrimSpace(line), " ")
	target, _, _ = strings.Cut(target, " ")
	length := 0
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if h = strings.TrimSpace(h); h == "" {
			break
		}
		if v, ok := strings.CutPrefix(strings.ToLower(h), "content-length:"); ok {
			length, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(br, body); err != nil {
		return
	}
	u, err := url.Parse(target)
	if err != nil {
		return
	}
	status, answer := f.serve(method, strings.TrimPrefix(u.Path, "/"+dockerapi.APIVersion), u.Query(), body)
	fmt.Fprintf(conn, "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, len(answer), answer)
}

// serve carries out one request; it is where dieAt strikes.
func (f *fakeRuntime) serve(method, path string, q url.Values, body []byte) (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if path == "/_ping" {
		return 200, "OK"
	}
	if method != "GET" && method != "HEAD" {
		f.writes = append(f.writes, method+" "+path)
	}
	if ref, ok := strings.CutPrefix(path, "/images/"); ok && method == "GET" {
		if id, ok := f.images[strings.TrimSuffix(ref, "/json")]; ok {
			return 200, fmt.Sprintf(`{"Id":%q}`, id)
		}
		return 404, `{"message":"no such image"}`
	}
	rest, ok := strings.CutPrefix(path, "/containers/")
	if !ok {
		return 404, `{"message":"not served here"}`
	}
	ref, op, _ := strings.Cut(rest, "/")
	if ref == "create" {
		op = "create"
	}
	die := ""
	if d, ok := strings.CutSuffix(f.dieAt, " "+strings.TrimSpace(method+" "+op)); ok {
		die, f.dieAt = d, ""
	}
	if die == "before" {
		return 500, `{"message":"the executor was killed here"}`
	}
	status, answer := f.do(method, ref, op, q, body)
	if die == "after" {
		return 500, `{"message":"the executor was killed here"}`
	}
	return status, answer
}

func (f *fakeRuntime) do(method, ref, op string, q url.Values, body []byte) (int, string) {
	if op == "create" {
		var req struct {
			Image  string
			Labels map[string]string
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return 400, `{"message":"bad body"}`
		}
		if f.lookup(q.Get("name")) != nil {
			return 409, `{"message":"the name is in use"}`
		}
		img, ok := f.images[req.Image]
		if !ok {
			return 404, `{"message":"no such image"}`
		}
		return 201, fmt.Sprintf(`{"Id":%q}`, f.add(q.Get("name"), img, false, req.Labels).id)
	}
	c := f.lookup(ref)
	if c == nil {
		return 404, `{"message":"no such container"}`
	}
	switch method + " " + op {
	case "GET json":
		status := map[bool]string{true: "running", false: "exited"}[c.running]
		b, _ := json.Marshal(map[string]any{"Id": c.id, "Name": "/" + c.name, "Image": c.image,
			"State": map[string]any{"Running": c.running, "Status": status}, "Config": map[string]any{"Labels": c.labels}})
		return 200, string(b)
	case "POST start", "POST stop":
		if c.running == (op == "start") {
			return 304, ""
		}
		c.running = op == "start"
	case "POST rename":
		if f.lookup(q.Get("name")) != nil {
			return 409, `{"message":"the name is in use"}`
		}
		c.name = q.Get("name")
	case "DELETE ":
		f.ctrs = slices.DeleteFunc(f.ctrs, func(x *fakeCtr) bool { return x == c })
	default:
		return 404, `{"message":"not served here"}`
	}
	return 204, ""
}

// ADR 0118 and 0100 for a container taken over on an adopted node, killed
// at each instant of the take-over: the found container is named in the
// intent before it is stopped or renamed, so whatever the next apply is
// (the same declaration, one whose module is no longer taken, or the
// undeclare itself) the found container is never lost under its aside
// name nor read as removed by something else, and undeclaring gives it
// back under its name, as it was found.
func TestContainerTakeOverSurvivesAKill(t *testing.T) {
	img := "r/x@sha256:" + strings.Repeat("a", 64)
	ctr := `{"module":"old","id":"c","type":"container","name":"lpfound","image":"` + img + `","command":["/app"]}`
	adopted := func(taken string, res ...string) string {
		d := `{"version":1,"adopted":true,"taken":[` + taken + `],"resources":[` + strings.Join(res, ",") + `]}`
		if len(res) == 0 {
			d = strings.Replace(d, `]}`, `],"owns_nothing":true}`, 1)
		}
		return d
	}
	for _, running := range []bool{true, false} {
		for _, heldFirst := range []bool{false, true} {
			for _, die := range []string{"before POST stop", "after POST stop", "after POST rename", "after POST create", "after POST start"} {
				for _, next := range []string{"apply", "apply-untaken", "undeclare"} {
					name := fmt.Sprintf("running=%v/held-first=%v/die-%s/then-%s", running, heldFirst, strings.ReplaceAll(die, " ", "-"), next)
					t.Run(name, func(t *testing.T) {
						h := newHarness(t)
						rt := newFakeRuntime(t, img)
						id := rt.found("lpfound", running)
						asFound := fmt.Sprintf("lpfound %s running=%v", id[:8], running)
						if heldFirst {
							h.expect(h.apply(adopted("", ctr)), shapes.Held, "old.c=held")
						}
						rt.dieAt = die
						if rep := h.apply(adopted(`"old"`, ctr)); rep.Outcome != shapes.Failed {
							t.Fatalf("the killed apply: %+v", rep)
						}
						switch next {
						case "apply", "apply-untaken":
							taken := `"old"`
							if next == "apply-untaken" {
								taken = ""
							}
							rep := h.apply(adopted(taken, ctr))
							if rep.Outcome == shapes.Failed || rep.Outcome == shapes.HeldChanged {
								t.Fatalf("the apply after the kill: %+v\n%s", rep, rt.state())
							}
							want := fmt.Sprintf("lpfound (the host's) running=true; lpfound-found-by-mesh %s running=false", id[:8])
							if got := rt.state(); got != want {
								t.Fatalf("after the kill and an apply: %s\nwant the host's under the name and the found one set aside: %s", got, want)
							}
							h.expect(h.apply(adopted(taken, ctr)), shapes.Unchanged, "old.c=unchanged")
						}
						// Undeclared: the found container comes back, as found.
						wantOut, wantLine := shapes.Restored, "old.c=restored"
						if next == "undeclare" && (die == "before POST stop" || die == "after POST stop" && !running) {
							// Never set aside, never stopped by the host: nothing to give back.
							wantOut, wantLine = shapes.Forgotten, "old.c=forgotten"
						}
						h.expect(h.apply(adopted(`"old"`)), wantOut, wantLine)
						if got := rt.state(); got != asFound {
							t.Fatalf("undeclared: %s\nwant the found container given back as found: %s", got, asFound)
						}
						if e := mustStore(t, h.state).Get("container:lpfound"); e != nil {
							t.Fatalf("the store still holds %+v", e)
						}
					})
				}
			}
		}
	}
}
