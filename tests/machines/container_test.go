package machines

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The container and network shapes against real podman in a lab machine,
// through its Docker-compatible API on /run/podman/podman.sock (socket
// activated by the lab's systemd), each claim asserted from outside the
// executor with `podman inspect` and `podman network inspect`.
//
// No registry is reachable here, so the test serves one: a tiny image it
// builds itself (one static Go program in an uncompressed layer), its
// config and manifest digests computed here, served by an OCI distribution
// endpoint (GET /v2/, manifests and blobs by digest) listening on the lab's
// own loopback. podman pulls it by digest: the real path, no `podman load`.

// ociImage is an image as a registry serves it.
type ociImage struct {
	repo                     string
	manifest, config, layer  []byte
	manifestD, configD, layD string
}

func sha(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

// buildImage builds a static program that waits for SIGTERM, puts it at
// /app in a layer, and makes the config and manifest naming it.
func buildImage(t *testing.T, repo string) *ociImage {
	dir := t.TempDir()
	src := "package main\n\nimport (\n\t\"os\"\n\t\"os/signal\"\n\t\"syscall\"\n)\n\n" +
		"func main() {\n\tc := make(chan os.Signal, 1)\n\tsignal.Notify(c, syscall.SIGTERM, syscall.SIGINT)\n\t<-c\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module app\n\ngo 1.22\n"), 0o644)
	build := exec.Command("go", "build", "-o", "app", ".")
	build.Dir = dir
	// A module of its own: not the workspace the Makefile builds in.
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the image's program: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(dir, "app"))
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, d := range []string{"etc/", "tmp/", "proc/", "sys/", "dev/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))})
	tw.Write(bin)
	tw.Close()
	img := &ociImage{repo: repo, layer: layer.Bytes()}
	img.layD = sha(img.layer)
	img.config, _ = json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Cmd": []string{"/app"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{img.layD}},
	})
	img.configD = sha(img.config)
	img.manifest, _ = json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": img.configD, "size": len(img.config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": img.layD, "size": len(img.layer)}},
	})
	img.manifestD = sha(img.manifest)
	return img
}

// registry is an OCI distribution endpoint serving one image by digest.
type registry struct {
	addr string
	mu   sync.Mutex
	log  []string
}

func (g *registry) requests() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.log, "\n")
}

// serveRegistry listens on 127.0.0.1:5000 inside the lab's network
// namespace (the socket is made there by a thread that entered it, and
// stays there) and serves img.
func serveRegistry(t *testing.T, m *machine, img *ociImage) *registry {
	ch := make(chan any)
	go func() {
		// This thread enters the lab's netns and is never given back to
		// the scheduler: it exits with the goroutine.
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", m.PID()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- fmt.Errorf("setns: %w", err)
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:5000")
		if err != nil {
			ch <- err
			return
		}
		ch <- l
	}()
	var l net.Listener
	switch v := (<-ch).(type) {
	case error:
		t.Fatalf("registry in the lab: %v", v)
	case net.Listener:
		l = v
	}
	g := &registry{addr: "127.0.0.1:5000"}
	blobs := map[string][]byte{img.configD: img.config, img.layD: img.layer}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.log = append(g.log, r.Method+" "+r.URL.Path)
		g.mu.Unlock()
		p := r.URL.Path
		switch {
		case p == "/v2/" || p == "/v2":
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			w.Write([]byte("{}"))
		case p == "/v2/"+img.repo+"/manifests/"+img.manifestD:
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Docker-Content-Digest", img.manifestD)
			w.Header().Set("Content-Length", fmt.Sprint(len(img.manifest)))
			w.Write(img.manifest)
		case strings.HasPrefix(p, "/v2/"+img.repo+"/blobs/") && blobs[strings.TrimPrefix(p, "/v2/"+img.repo+"/blobs/")] != nil:
			b := blobs[strings.TrimPrefix(p, "/v2/"+img.repo+"/blobs/")]
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Docker-Content-Digest", strings.TrimPrefix(p, "/v2/"+img.repo+"/blobs/"))
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			w.Write(b)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			w.Write([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"only by digest here"}]}`))
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return g
}

// podmanLab boots a lab with podman configured the one way it runs in a
// lab (runc, as crun's setrlimit of RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE;
// no pids limit, as the lab's cgroup has no pids controller; vfs storage
// on the overlay root) and the test's registry named insecure, and its API
// socket started.
func podmanLab(t *testing.T) *machine {
	m := boot(t, lab.Options{Seed: map[string]string{
		"/etc/containers/containers.conf": "[containers]\npids_limit = 0\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
		"/etc/containers/storage.conf": "[storage]\ndriver = \"vfs\"\n" +
			"runroot = \"/run/containers/storage\"\ngraphroot = \"/var/lib/containers/storage\"\n",
		"/etc/containers/registries.conf": "unqualified-search-registries = []\n\n[[registry]]\nlocation = \"127.0.0.1:5000\"\ninsecure = true\n",
	}})
	return m
}

// inspect runs `podman inspect` with a Go template in the lab; "" when the
// container does not exist.
func (m *machine) podmanField(name, format string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _, err := m.Run(ctx, "podman", "container", "inspect", name, "--format", format)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

func (m *machine) networkExists(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err := m.Run(ctx, "podman", "network", "inspect", name)
	return err == nil
}

func TestContainerAndNetworkOnPodman(t *testing.T) {
	m := podmanLab(t)
	img := buildImage(t, "lp/app")
	reg := serveRegistry(t, m, img)
	ref := reg.addr + "/" + img.repo + "@" + img.manifestD

	ctr := func(env string) string {
		return `{"module":"app","id":"web","type":"container","name":"lpweb","image":"` + ref + `","env":{"MODE":"` + env + `"},"network":"lpnet"}`
	}
	const nw = `{"module":"app","id":"net","type":"network","name":"lpnet"}`

	// No runtime answers yet: refused whole, by name, nothing touched.
	rep, code := m.apply(decl(`{"module":"app","id":"f","type":"file","path":"/root/marker","content":"x"}`, nw, ctr("a")))
	if code == 0 || rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, "this host cannot apply 'network': no container runtime answered _ping") ||
		!strings.Contains(rep.Refused, "/run/podman/podman.sock: absent") {
		t.Fatalf("without a runtime: exit %d %+v", code, rep)
	}
	if m.sh("test -e /root/marker && echo yes || echo no") != "no" {
		t.Fatal("a refused declaration touched the machine")
	}
	// A partial host refuses the shape by name.
	rep, _ = m.apply(decl(nw), "apply", "--partial")
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, `a partial host applies only file, directory, region, keys, action and archive, not "network"`) {
		t.Fatalf("partial: %+v", rep)
	}

	m.sh("systemctl start podman.socket")

	// Create: the network, then the container pulled by digest from the
	// registry and started; read back from outside.
	rep, code = m.apply(decl(nw, ctr("a")))
	expect(t, rep, shapes.Applied, "app.net=applied app.web=applied")
	t.Logf("create: %+v", rep.Lines)
	if !strings.Contains(reg.requests(), "GET /v2/lp/app/manifests/"+img.manifestD) || !strings.Contains(reg.requests(), "GET /v2/lp/app/blobs/"+img.layD) {
		t.Fatalf("podman did not pull by digest from the test's registry:\n%s", reg.requests())
	}
	if got := m.podmanField("lpweb", "{{.State.Status}} {{.Image}}"); got != "running "+strings.TrimPrefix(img.configD, "sha256:") {
		t.Fatalf("podman inspect lpweb: %q, want running from image %s", got, img.configD)
	}
	label := m.podmanField("lpweb", `{{index .Config.Labels "nox-mesh-host.spec"}}`)
	if !strings.HasPrefix(label, "sha256:") || len(label) != 71 {
		t.Fatalf("the spec label: %q", label)
	}
	if !strings.Contains(m.podmanField("lpweb", "{{json .NetworkSettings.Networks}}"), "lpnet") || !m.networkExists("lpnet") {
		t.Fatal("lpweb is not on lpnet, or lpnet is not there")
	}
	first := m.podmanField("lpweb", "{{.Id}}")

	// The second apply changes nothing.
	rep, _ = m.apply(decl(nw, ctr("a")))
	expect(t, rep, shapes.Unchanged, "app.net=unchanged app.web=unchanged")

	// Drift: stopped by hand, then removed by hand; both repaired.
	m.sh("podman stop -t 0 lpweb >/dev/null")
	rep, _ = m.apply(decl(nw, ctr("a")))
	expect(t, rep, shapes.Repaired, "app.net=unchanged app.web=repaired")
	if got := m.podmanField("lpweb", "{{.State.Status}} {{.Id}}"); got != "running "+first {
		t.Fatalf("after a stop by hand: %q", got)
	}
	m.sh("podman rm -f -t 0 lpweb >/dev/null")
	rep, _ = m.apply(decl(nw, ctr("a")))
	expect(t, rep, shapes.Repaired, "app.net=unchanged app.web=repaired")
	if got := m.podmanField("lpweb", `{{.State.Status}} {{index .Config.Labels "nox-mesh-host.spec"}}`); got != "running "+label {
		t.Fatalf("after a removal by hand: %q", got)
	}

	// A changed declaration replaces the container: new label, new id, the
	// declared environment.
	before := m.podmanField("lpweb", "{{.Id}}")
	rep, _ = m.apply(decl(nw, ctr("b")))
	expect(t, rep, shapes.Applied, "app.net=unchanged app.web=applied")
	t.Logf("changed: %+v", rep.Lines)
	if id := m.podmanField("lpweb", "{{.Id}}"); id == before || id == "" {
		t.Fatalf("not replaced: %q", id)
	}
	if l := m.podmanField("lpweb", `{{index .Config.Labels "nox-mesh-host.spec"}}`); l == label || l == "" {
		t.Fatalf("label after the change: %q", l)
	}
	if env := m.podmanField("lpweb", "{{json .Config.Env}}"); !strings.Contains(env, `"MODE=b"`) {
		t.Fatalf("environment after the change: %s", env)
	}

	// A container the host does not own attached to its network: the
	// undeclared container is removed, the network kept and said so.
	m.sh("podman run -d --name lpforeign --network lpnet " + ref + " >/dev/null")
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Kept, "app.web=removed app.net=kept")
	t.Logf("undeclared: %+v", rep.Lines)
	if !strings.Contains(rep.Lines[1].Detail, "lpforeign") {
		t.Fatalf("the kept line does not name the foreign container: %q", rep.Lines[1].Detail)
	}
	if m.podmanField("lpweb", "{{.Id}}") != "" || !m.networkExists("lpnet") || m.podmanField("lpforeign", "{{.State.Status}}") != "running" {
		t.Fatal("after undeclaring: lpweb must be gone, lpnet and lpforeign left")
	}
	// Once nothing of another's is attached, a later apply removes it.
	m.sh("podman rm -f -t 0 lpforeign >/dev/null")
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Removed, "app.net=removed")
	if m.networkExists("lpnet") {
		t.Fatal("lpnet is still there")
	}

	// A name taken by a container the host did not make: refused on a
	// node that is not adopted, held on an adopted one, never removed.
	m.sh("podman run -d --name lpfound --network none " + ref + " >/dev/null")
	found := m.podmanField("lpfound", "{{.Id}}")
	foundCtr := `{"module":"old","id":"c","type":"container","name":"lpfound","image":"` + ref + `","command":["/app","x"]}`
	rep, _ = m.apply(decl(foundCtr))
	if rep.Outcome != shapes.Failed || !strings.Contains(rep.Lines[0].Detail, "did not make (no nox-mesh-host.spec label); not touched") {
		t.Fatalf("a foreign container by name: %+v", rep)
	}
	adopted := func(res ...string) string {
		return `{"version":1,"adopted":true,"taken":[],"resources":[` + strings.Join(res, ",") + `]}`
	}
	rep, _ = m.apply(adopted(foundCtr))
	expect(t, rep, shapes.Held, "old.c=held")
	rep, _ = m.apply(adopted(foundCtr))
	expect(t, rep, shapes.Held, "old.c=held")
	rep, _ = m.apply(`{"version":1,"adopted":true,"taken":[],"resources":[],"owns_nothing":true}`)
	expect(t, rep, shapes.Forgotten, "old.c=forgotten")
	if got := m.podmanField("lpfound", `{{.Id}} {{.State.Status}} {{index .Config.Labels "nox-mesh-host.spec"}}`); got != found+" running" {
		t.Fatalf("the held container was touched: %q", got)
	}

	// Held, then changed by something else (stopped): held-changed, left
	// as it is; then removed by something else: held-changed, and not made
	// again before its module is taken (ADR 0100).
	rep, _ = m.apply(adopted(foundCtr))
	expect(t, rep, shapes.Held, "old.c=held")
	m.sh("podman stop -t 0 lpfound >/dev/null")
	rep, _ = m.apply(adopted(foundCtr))
	expect(t, rep, shapes.HeldChanged, "old.c=held-changed")
	if !strings.Contains(rep.Lines[0].Detail, "changed by something else since it was found") || m.podmanField("lpfound", "{{.State.Status}}") != "exited" {
		t.Fatalf("%+v", rep.Lines)
	}
	m.sh("podman rm -f -t 0 lpfound >/dev/null")
	rep, _ = m.apply(adopted(foundCtr))
	expect(t, rep, shapes.HeldChanged, "old.c=held-changed")
	if !strings.Contains(rep.Lines[0].Detail, "removed by something else since it was found; not made again before the module is taken") || m.podmanField("lpfound", "{{.Id}}") != "" {
		t.Fatalf("a held container that vanished was made again: %+v", rep.Lines)
	}
	rep, _ = m.apply(`{"version":1,"adopted":true,"taken":[],"resources":[],"owns_nothing":true}`)
	expect(t, rep, shapes.Forgotten, "old.c=forgotten")

	// Taken over: the found container is set aside whole (stopped, another
	// name), the host's runs under its name; undeclared, the host's goes
	// and the found one comes back under its name, running as it was.
	m.sh("podman run -d --name lpfound --network none " + ref + " >/dev/null")
	found = m.podmanField("lpfound", "{{.Id}}")
	rep, _ = m.apply(`{"version":1,"adopted":true,"taken":["old"],"resources":[` + foundCtr + `]}`)
	expect(t, rep, shapes.Applied, "old.c=applied")
	if got := m.podmanField("lpfound-found-by-mesh", "{{.Id}} {{.State.Status}}"); got != found+" exited" {
		t.Fatalf("the found container was not set aside whole: %q (%+v)", got, rep.Lines)
	}
	if m.podmanField("lpfound", `{{index .Config.Labels "nox-mesh-host.spec"}}`) == "" {
		t.Fatal("the host's container does not run under the name")
	}
	rep, _ = m.apply(`{"version":1,"adopted":true,"taken":["old"],"resources":[],"owns_nothing":true}`)
	expect(t, rep, shapes.Restored, "old.c=restored")
	if got := m.podmanField("lpfound", `{{.Id}} {{.State.Status}} {{index .Config.Labels "nox-mesh-host.spec"}}`); got != found+" running" {
		t.Fatalf("the found container was not given back as it was found: %q (%+v)", got, rep.Lines)
	}
	m.sh("podman rm -f -t 0 lpfound >/dev/null")

	// kill -9 of the executor at a random instant of an apply; the next
	// apply converges, the one after changes nothing.
	full := decl(nw, ctr("k"))
	start := time.Now()
	rep, _ = m.apply(full)
	expect(t, rep, shapes.Applied, "app.net=applied app.web=applied")
	whole := time.Since(start)
	m.WriteFile("/root/full.json", []byte(full), 0o600)
	rng := rand.New(rand.NewSource(11))
	for i := 0; i < 4; i++ {
		m.apply(decl())
		delay := time.Duration(rng.Int63n(int64(whole)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m.Run(ctx, "/bin/sh", "-c", fmt.Sprintf("/usr/local/bin/mesh-executor apply /root/full.json >/dev/null 2>&1 & p=$!; sleep %.4f; kill -9 $p; wait $p 2>/dev/null; true", delay.Seconds()))
		cancel()
		rep, code := m.apply(full)
		if code != 0 || rep.Outcome == shapes.Failed {
			t.Fatalf("kill %d at %v: the next apply: exit %d %+v", i, delay, code, rep)
		}
		rep, _ = m.apply(full)
		expect(t, rep, shapes.Unchanged, "app.net=unchanged app.web=unchanged")
		if got := m.podmanField("lpweb", "{{.State.Status}}"); got != "running" || !m.networkExists("lpnet") {
			t.Fatalf("kill %d at %v: lpweb %q", i, delay, got)
		}
	}
	rep, _ = m.apply(decl())
	expect(t, rep, shapes.Removed, "app.web=removed app.net=removed")
	if m.podmanField("lpweb", "{{.Id}}") != "" || m.networkExists("lpnet") {
		t.Fatal("undeclared, but still there")
	}
}
