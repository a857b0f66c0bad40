package engine

import (
	"encoding/json"
	"strings"
	"testing"

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
