package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/firewall"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// fakeFirewall is a ruleset of chains holding the mesh's rules by spec;
// the real nftables and iptables-nft are driven in a bare netns (package
// firewall) and in the lab (tests/machines).
type fakeFirewall struct {
	chains []firewall.Chain
	rules  map[firewall.Chain]map[string]string // chain -> spec -> comment
	log    []string
}

func newFakeFirewall(chains ...string) *fakeFirewall {
	f := &fakeFirewall{rules: map[firewall.Chain]map[string]string{}}
	for _, c := range chains {
		ch := firewall.Chain{Table: "filter", Name: c}
		f.chains = append(f.chains, ch)
		f.rules[ch] = map[string]string{}
	}
	return f
}

func (*fakeFirewall) Name() string { return "fake" }
func (f *fakeFirewall) Observe(_ context.Context, s firewall.Spec) (firewall.State, error) {
	var st firewall.State
	for _, c := range f.chains {
		if _, ok := f.rules[c][s.String()]; ok {
			st.Open = append(st.Open, c)
		} else {
			st.Missing = append(st.Missing, c)
		}
	}
	return st, nil
}
func (f *fakeFirewall) Open(_ context.Context, s firewall.Spec, comment string, into []firewall.Chain) error {
	for _, c := range into {
		f.rules[c][s.String()] = comment
		f.log = append(f.log, "open "+c.Name+" "+s.String()+" "+comment)
	}
	return nil
}
func (f *fakeFirewall) Close(_ context.Context, s firewall.Spec) ([]firewall.Chain, error) {
	var from []firewall.Chain
	for _, c := range f.chains {
		if _, ok := f.rules[c][s.String()]; ok {
			delete(f.rules[c], s.String())
			from = append(from, c)
			f.log = append(f.log, "close "+c.Name+" "+s.String())
		}
	}
	return from, nil
}

func withFirewall(t *testing.T, fw firewall.Firewall, err error) {
	t.Helper()
	old := detectFirewall
	detectFirewall = func(context.Context) (firewall.Firewall, error) { return fw, err }
	t.Cleanup(func() { detectFirewall = old })
}

const web = `{"module":"web","id":"http","type":"opening","port":8080,"protocol":"tcp","from":"10.231.1.0/24","path":"incoming"}`

func TestOpeningLifecycle(t *testing.T) {
	h := newHarness(t)
	f := newFakeFirewall("input", "INPUT")
	withFirewall(t, f, nil)

	// plan says what it would add, and adds nothing.
	rep := h.run(store.Local, h.doc(web), true)
	h.expect(rep, shapes.Applied, "web.http=applied")
	if !strings.Contains(rep.Lines[0].Detail, "would add an accept rule for tcp 8080 from 10.231.1.0/24 (incoming) in") || len(f.log) != 0 {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	rep = h.apply(h.doc(web))
	h.expect(rep, shapes.Applied, "web.http=applied")
	if len(f.log) != 2 || !strings.HasSuffix(f.log[0], `nox-mesh-host web.http`) {
		t.Fatalf("%q", f.log)
	}
	f.log = nil
	h.expect(h.apply(h.doc(web)), shapes.Unchanged, "web.http=unchanged")
	if len(f.log) != 0 {
		t.Fatalf("an unchanged opening wrote: %q", f.log)
	}
	// A rule deleted by hand from one chain: put back there only.
	delete(f.rules[f.chains[1]], "tcp 8080 from 10.231.1.0/24 (incoming)")
	rep = h.apply(h.doc(web))
	h.expect(rep, shapes.Repaired, "web.http=repaired")
	if len(f.log) != 1 || !strings.HasPrefix(f.log[0], "open INPUT ") {
		t.Fatalf("%q", f.log)
	}
	// A changed declaration (another source prefix) is another rule: the
	// new one added, the old one removed.
	f.log = nil
	moved := strings.Replace(web, "10.231.1.0/24", "10.231.9.0/24", 1)
	rep = h.apply(h.doc(moved))
	h.expect(rep, shapes.Applied, "web.http=applied web.http=removed")
	if strings.Join(f.log, "; ") != "open input tcp 8080 from 10.231.9.0/24 (incoming) nox-mesh-host web.http; open INPUT tcp 8080 from 10.231.9.0/24 (incoming) nox-mesh-host web.http; close input tcp 8080 from 10.231.1.0/24 (incoming); close INPUT tcp 8080 from 10.231.1.0/24 (incoming)" {
		t.Fatalf("%q", f.log)
	}
	// plan of the undeclare names the removal and removes nothing.
	f.log = nil
	rep = h.run(store.Local, h.doc(), true)
	if outcomes(rep) != "web.http=removed" || !strings.Contains(rep.Lines[0].Detail, "would be removed") || len(f.log) != 0 {
		t.Fatalf("%+v %q", rep.Lines, f.log)
	}
	rep = h.apply(h.doc())
	h.expect(rep, shapes.Removed, "web.http=removed")
	if len(f.log) != 2 || len(f.rules[f.chains[0]]) != 0 || len(f.rules[f.chains[1]]) != 0 {
		t.Fatalf("%q %v", f.log, f.rules)
	}
	h.expect(h.apply(h.doc()), shapes.Unchanged, "")
}

// No chain filters the path: nothing to add, said so.
func TestOpeningNothingFilters(t *testing.T) {
	h := newHarness(t)
	withFirewall(t, newFakeFirewall(), nil)
	rep := h.apply(h.doc(web))
	h.expect(rep, shapes.Unchanged, "web.http=unchanged")
	if !strings.Contains(rep.Lines[0].Detail, "no fake chain filters this path; reachable as it is") {
		t.Fatalf("%+v", rep.Lines)
	}
	h.expect(h.apply(h.doc()), shapes.Removed, "web.http=removed")
}

// firewalld or ufw found: the step fails with the firewall's name, and
// nothing is written or recorded; the same on the way out.
func TestOpeningRefusedThroughAFrontEnd(t *testing.T) {
	h := newHarness(t)
	withFirewall(t, nil, &firewall.Refused{Firewall: "firewalld", Reason: "firewalld is running: an opening through it is not built; refused rather than half-done"})
	rep := h.apply(h.doc(web, `{"module":"web","id":"later","type":"directory","path":"{root}/later"}`))
	h.expect(rep, shapes.Failed, "web.http=failed")
	if d := rep.Lines[0].Detail; !strings.Contains(d, "firewalld is running: an opening through it is not built; refused rather than half-done") || !strings.Contains(d, "1 later resource not attempted") {
		t.Fatal(d)
	}
	st, _ := store.Open(h.state)
	if e := st.Get("opening:incoming/8080/tcp/10.231.1.0/24"); e != nil {
		t.Fatalf("recorded: %+v", e)
	}

	f := newFakeFirewall("input")
	withFirewall(t, f, nil)
	h.expect(h.apply(h.doc(web)), shapes.Applied, "web.http=applied")
	withFirewall(t, nil, &firewall.Refused{Firewall: "ufw", Reason: "ufw is active: an opening through it is not built; refused rather than half-done"})
	rep = h.apply(h.doc())
	h.expect(rep, shapes.Failed, "web.http=failed")
	if !strings.Contains(rep.Lines[0].Detail, "cannot remove the mesh's rule: ufw is active") {
		t.Fatal(rep.Lines[0].Detail)
	}
	// Still recorded: removed once the firewall can be written again.
	withFirewall(t, f, nil)
	h.expect(h.apply(h.doc()), shapes.Removed, "web.http=removed")
}

// A partial host refuses an opening by name, before anything is touched.
func TestOpeningRefusedOnAPartialHost(t *testing.T) {
	h := newHarness(t)
	f := newFakeFirewall("input")
	withFirewall(t, f, nil)
	doc := h.doc(web)
	d, err := shapes.ParseTrusted([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := store.Open(h.state)
	st.Lock(time.Second)
	defer st.Unlock()
	rep := Apply(context.Background(), st, d, []byte(doc), Options{Source: store.Local, Partial: true})
	if rep.Outcome != shapes.Refused || !strings.Contains(rep.Refused, `a partial host applies only file, directory, region, keys, action and archive, not "opening"`) || len(f.log) != 0 {
		t.Fatalf("%+v %q", rep, f.log)
	}
}

func TestSpecOfTarget(t *testing.T) {
	for _, o := range []*shapes.Opening{
		{Port: 8080, Protocol: "tcp", Path: "incoming"},
		{Port: 53, Protocol: "udp", Path: "forwarded", From: "10.0.0.0/8"},
		{Port: 22, Protocol: "tcp", Path: "incoming", From: "fd00::1"},
	} {
		want, _ := openingSpec(o)
		got, err := specOfTarget(shapes.Target(o))
		if err != nil || got != want {
			t.Errorf("%s: %v %v, want %v", shapes.Target(o), got, err, want)
		}
	}
	for _, bad := range []string{"opening:", "opening:incoming/x/tcp/", "path:/etc/motd"} {
		if _, err := specOfTarget(bad); err == nil {
			t.Errorf("%q read as an opening", bad)
		}
	}
}
