// Package shapegen generates valid declarations of every shape, drawn from
// a seed, for tests of code that takes a declaration: the daemon's request
// handlers, the rescue command, the chaos run. Listing inputs by hand
// leaves out the combinations nobody thought of (a plan of a directory, a
// service with no state); generating them from the vocabulary does not.
//
// It is pure: it writes nothing and reads nothing from the machine. Paths
// are under the root it is given, so a test that applies what it generates
// on a host that does file shapes for real writes only into its scratch
// tree. Names (units, packages, users, containers) carry a prefix no real
// machine has, so an observe step finds them absent.
package shapegen

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// Gen draws resources and declarations from its source.
type Gen struct {
	R *rand.Rand
	// Root is the directory every generated path is under.
	Root string
	// Prefix starts every generated name of a thing that is not a path
	// (default "meshgen").
	Prefix string
	n      int
}

// New returns a generator seeded with seed, its paths under root.
func New(seed uint64, root string) *Gen {
	return &Gen{R: rand.New(rand.NewPCG(seed, 0x73686170)), Root: root, Prefix: "meshgen"}
}

// Types is every shape of the vocabulary, in its own order.
func Types() []string { return shapes.TypeNames() }

func (g *Gen) pick(xs ...string) string { return xs[g.R.IntN(len(xs))] }
func (g *Gen) coin() bool               { return g.R.IntN(2) == 0 }

// name is a fresh name, unique within this generator.
func (g *Gen) name() string {
	g.n++
	return fmt.Sprintf("%s%d", g.Prefix, g.n)
}

func (g *Gen) path() string { return g.Root + "/" + g.name() }

func (g *Gen) text() string {
	words := []string{"alpha", "beta", "gamma", "δέλτα", "line", "x=1", "# comment", ""}
	var b strings.Builder
	for range g.R.IntN(4) + 1 {
		b.WriteString(g.pick(words...))
		b.WriteString("\n")
	}
	return b.String()
}

func (g *Gen) hex64() string {
	var b strings.Builder
	for range 64 {
		b.WriteByte("0123456789abcdef"[g.R.IntN(16)])
	}
	return b.String()
}

func (g *Gen) wgKey() string {
	k := make([]byte, 32)
	for i := range k {
		k[i] = byte(g.R.IntN(256))
	}
	return base64.StdEncoding.EncodeToString(k)
}

// Resource is one resource of type typ, in module and with id, as the JSON
// object a declaration carries. Its optional fields are present or absent
// at random.
func (g *Gen) Resource(typ, module, id string) map[string]any {
	r := map[string]any{"module": module, "id": id, "type": typ}
	opt := func(k string, v any) {
		if g.coin() {
			r[k] = v
		}
	}
	switch typ {
	case shapes.TypeFile:
		r["path"] = g.path()
		switch g.R.IntN(2) {
		case 0:
			r["content"] = g.text()
		default:
			r["bytes"] = base64.StdEncoding.EncodeToString([]byte(g.text()))
		}
		opt("mode", g.pick("0644", "0600", "0640", "0755"))
		opt("owner", g.pick("root", "root:root", "0:0", "0"))
	case shapes.TypeDirectory:
		r["path"] = g.path()
		opt("mode", g.pick("0755", "0700", "0750"))
		opt("owner", g.pick("root", "0:0"))
	case shapes.TypeAction:
		r["run"] = []string{"/bin/true"}
		r["verify"] = []string{"/bin/true"}
		opt("timeout", g.R.IntN(30)+1)
	case shapes.TypeService:
		r["unit"] = g.name() + g.pick("", ".service")
		opt("state", g.pick("running", "stopped"))
		opt("enabled", g.coin())
	case shapes.TypePackage:
		r["name"] = g.name()
		opt("version", fmt.Sprintf("%d.%d-%d", g.R.IntN(9)+1, g.R.IntN(20), g.R.IntN(5)+1))
	case shapes.TypeUser:
		r["name"] = g.name()
		opt("shell", g.pick("/bin/sh", "/usr/sbin/nologin"))
		opt("home", g.path())
		opt("groups", []string{g.name()})
	case shapes.TypeArchive:
		r["sha256"] = g.hex64()
		r["url"] = "obj://" + r["sha256"].(string)
		r["destination"] = g.path()
	case shapes.TypeContainer:
		r["name"] = g.name()
		r["image"] = "registry.invalid/" + g.name() + "@sha256:" + g.hex64()
		opt("command", []string{"serve", "--" + g.name()})
		opt("env", map[string]string{"MODE": g.pick("a", "b")})
		opt("ports", []string{fmt.Sprintf("%d:80/tcp", 20000+g.R.IntN(20000))})
		opt("mounts", []string{g.path() + ":/data:ro"})
		opt("network", g.name())
	case shapes.TypeNetwork:
		r["name"] = g.name()
	case shapes.TypeOverlay:
		r["interface"] = fmt.Sprintf("mg%d", g.R.IntN(100000))
		r["address"] = fmt.Sprintf("10.%d.%d.%d/16", 40+g.R.IntN(10), g.R.IntN(256), 1+g.R.IntN(254))
		opt("listen_port", 40000+g.R.IntN(20000))
		if g.coin() {
			p := map[string]any{"public_key": g.wgKey(), "allowed_ips": []string{fmt.Sprintf("10.%d.0.%d/32", 40+g.R.IntN(10), 1+g.R.IntN(254))}}
			if g.coin() {
				p["endpoint"] = fmt.Sprintf("192.0.2.%d:51820", 1+g.R.IntN(254))
			}
			if g.coin() {
				p["keepalive"] = 25
			}
			r["peers"] = []any{p}
		} else if g.coin() {
			r["roster"] = true
			opt("roster_min", 1+g.R.IntN(1000))
		}
	case shapes.TypeOpening:
		r["port"] = 1 + g.R.IntN(65535)
		r["protocol"] = g.pick("tcp", "udp")
		opt("from", g.pick("10.44.0.0/16", "192.0.2.7"))
		r["path"] = g.pick("incoming", "forwarded")
	case shapes.TypeRegion:
		r["path"] = g.path()
		r["content"] = strings.TrimSuffix(g.text(), "\n") + "\n"
		opt("comment", g.pick("#", "//", ";"))
	case shapes.TypeKeys:
		r["path"] = g.path()
		r["format"] = g.pick("equals", "space")
		r["set"] = map[string]string{"Key" + g.name(): g.pick("yes", "no", "42")}
	case shapes.TypeProcess:
		r["name"] = g.name()
		r["exec"] = []string{"/bin/sleep", "3600"}
		r["user"] = "nobody"
		opt("env", map[string]string{"MODE": g.pick("a", "b")})
		opt("state", g.pick("running", "stopped"))
	default:
		panic("shapegen: no generator for shape " + typ)
	}
	return r
}

// Options shape a declaration.
type Options struct {
	Node, Enrolment string
	Seq             uint64
	// Types the resources are drawn from; all of Types() when empty.
	Types []string
	// Min and Max bound the number of resources (default 1 and 6).
	Min, Max int
}

// Declaration is a valid declaration with resources of the given types,
// drawn at random, as its JSON.
func (g *Gen) Declaration(o Options) []byte {
	types := o.Types
	if len(types) == 0 {
		types = Types()
	}
	lo, hi := o.Min, o.Max
	if lo <= 0 {
		lo = 1
	}
	if hi < lo {
		hi = max(lo, 6)
	}
	n := lo + g.R.IntN(hi-lo+1)
	var rs []map[string]any
	for i := range n {
		rs = append(rs, g.Resource(types[g.R.IntN(len(types))], g.pick("base", "web", "mesh"), fmt.Sprintf("r%d", i)))
	}
	return g.marshal(o, rs)
}

// Each is one declaration per shape, each holding one resource of it: what
// a test that must see every shape go through a path iterates over.
func (g *Gen) Each(o Options) map[string][]byte {
	out := map[string][]byte{}
	for _, t := range Types() {
		out[t] = g.marshal(o, []map[string]any{g.Resource(t, "base", "r0")})
	}
	return out
}

func (g *Gen) marshal(o Options, rs []map[string]any) []byte {
	d := map[string]any{"version": 1, "node": o.Node, "enrolment": o.Enrolment, "seq": o.Seq, "resources": rs}
	b, err := json.Marshal(d)
	if err != nil {
		panic(err)
	}
	return b
}
