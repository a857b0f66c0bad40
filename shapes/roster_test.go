package shapes

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const keyA = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
const keyB = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="

func TestParseRoster(t *testing.T) {
	good := `{"version":1,"seq":3,"keepalive":25,"nodes":[` +
		`{"node":"a","public_key":"` + keyA + `","address":"10.99.0.1/32","endpoint":"192.0.2.1:51820"},` +
		`{"node":"b","public_key":"` + keyB + `","address":"10.99.0.2/32"}]}`
	r, err := ParseRoster([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	peers := r.PeersFor("a")
	if len(peers) != 1 || peers[0].PublicKey != keyB || peers[0].AllowedIPs[0] != "10.99.0.2/32" || peers[0].Keepalive != 25 {
		t.Fatalf("peers of a: %+v", peers)
	}
	if n := len(r.PeersFor("c")); n != 2 {
		t.Fatalf("a node not in the roster has %d peers, want every node", n)
	}
	for _, c := range []struct{ name, doc, want string }{
		{"version", `{"version":2,"seq":1,"nodes":[]}`, "version 2"},
		{"no seq", `{"version":1,"nodes":[]}`, "no sequence"},
		{"unknown field", `{"version":1,"seq":1,"nodes":[],"extra":1}`, "unknown field"},
		{"trailing", `{"version":1,"seq":1,"nodes":[]} {}`, "after the roster"},
		{"twice", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.0.0.1/32"},{"node":"a","public_key":"` + keyB + `","address":"10.0.0.2/32"}]}`, "named twice"},
		{"key twice", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.0.0.1/32"},{"node":"b","public_key":"` + keyA + `","address":"10.0.0.2/32"}]}`, "a's too"},
		{"address twice", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.0.0.1/32"},{"node":"b","public_key":"` + keyB + `","address":"10.0.0.1/32"}]}`, "a's too"},
		{"not a host", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.0.0.0/24"}]}`, "not one host"},
		{"bad key", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"eA==","address":"10.0.0.1/32"}]}`, "public_key"},
		{"bad endpoint", `{"version":1,"seq":1,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.0.0.1/32","endpoint":"host:1"}]}`, "endpoint"},
		{"keepalive", `{"version":1,"seq":1,"keepalive":70000,"nodes":[]}`, "keepalive"},
	} {
		if _, err := ParseRoster([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// An overlay takes its peers from the roster or declares them, not both.
func TestOverlayRosterOrPeers(t *testing.T) {
	base := `{"version":1,"node":"n","enrolment":"e","seq":1,"resources":[{"module":"mesh","id":"overlay","type":"overlay","interface":"mesh0","address":"10.99.0.1/16","roster":true%s}]}`
	d, err := Parse([]byte(strings.Replace(base, "%s", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Resources[0].(*Overlay); !o.Roster {
		t.Fatal("roster not read")
	}
	if _, err := Parse([]byte(strings.Replace(base, "%s", `,"peers":[{"public_key":"`+keyA+`","allowed_ips":["10.99.0.2/32"]}]`, 1))); err == nil {
		t.Fatal("an overlay with both roster and peers parsed")
	}
}

// roster_min bounds the roster's sequence, and only with roster.
func TestOverlayRosterMin(t *testing.T) {
	base := `{"version":1,"node":"n","enrolment":"e","seq":1,"resources":[{"module":"mesh","id":"overlay","type":"overlay","interface":"mesh0","address":"10.99.0.1/16"%s}]}`
	d, err := Parse([]byte(strings.Replace(base, "%s", `,"roster":true,"roster_min":7`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Resources[0].(*Overlay); !o.Roster || o.RosterMin != 7 {
		t.Fatalf("read %+v", o)
	}
	if _, err := Parse([]byte(strings.Replace(base, "%s", `,"roster_min":7`, 1))); err == nil || !strings.Contains(err.Error(), "roster_min") {
		t.Fatalf("roster_min without roster: %v", err)
	}
	if !slices.Contains(Accepts, AcceptsRosterMin) {
		t.Fatal("this build reads roster_min and does not say so")
	}
}

func FuzzParseRoster(f *testing.F) {
	f.Add([]byte(`{"version":1,"seq":3,"keepalive":25,"nodes":[{"node":"a","public_key":"` + keyA + `","address":"10.99.0.1/32","endpoint":"192.0.2.1:51820"}]}`))
	f.Add([]byte(`{"version":1,"seq":1,"nodes":[]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRoster(data)
		if err != nil {
			return
		}
		// Whatever parses gives each other node as one peer with one host.
		for _, n := range r.Nodes {
			if got := len(r.PeersFor(n.Node)); got != len(r.Nodes)-1 {
				t.Fatalf("%d peers for %s in a roster of %d", got, n.Node, len(r.Nodes))
			}
		}
	})
}

// BenchmarkParseRoster parses a roster of 1,000 nodes, as every node of
// an overlay that size does with each roster (the agent, then its
// executor).
func BenchmarkParseRoster(b *testing.B) {
	r := Roster{Version: 1, Seq: 1, Keepalive: 25}
	for i := range 1000 {
		k := make([]byte, 32)
		k[0], k[1] = byte(i), byte(i>>8)
		r.Nodes = append(r.Nodes, RosterNode{Node: fmt.Sprintf("n%05d", i), PublicKey: base64.StdEncoding.EncodeToString(k),
			Address: fmt.Sprintf("10.99.%d.%d/32", i/250, i%250+1), Endpoint: fmt.Sprintf("192.0.2.%d:51820", i%250+1)})
	}
	payload, err := json.Marshal(&r)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRoster(payload); err != nil {
			b.Fatal(err)
		}
	}
}
