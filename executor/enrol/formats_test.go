package enrol

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// copyGolden copies the golden of release's name into dir, private as
// the executor keeps it.
func copyGolden(t *testing.T, dir, release, name string) {
	t.Helper()
	b, err := os.ReadFile(golden.Path(release, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Every enrolment file a release wrote is read, each golden named by the
// commit whose code wrote it: the keys (one shape since they were first
// written) and the result, first and as the release before the format
// field left it; the pending enrolment as that release left it (the
// first release's was not made again: its code's dependencies could not
// be fetched where the goldens were made), and as a rekey leaves it; a
// rekey pending; the grant kept for the agent; and a rekey's pending
// enrolment with its new WireGuard key in a file of its own.
func TestEveryEnrolmentFormatThatShippedIsRead(t *testing.T) {
	golden.Releases(t, "c4a83c5", "9d97354", "2de1e35", "5c04c94")
	dir := t.TempDir()
	copyGolden(t, dir, "c4a83c5", KeysFile)
	k, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k.Enrolment != "e-7f3a" || k.Identity.Seed()[31] != 31 || k.Sealing == nil {
		t.Errorf("keys %+v", k)
	}
	copyGolden(t, dir, "9d97354", PendingFile)
	p, tok, err := loadPending(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.ID != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} || tok.BrokerURL != "tls://control.example:4222" || len(p.Identity) != 32 || p.Begun.IsZero() {
		t.Errorf("pending %+v, token %+v", p, tok)
	}
	// A rekey's files (2de1e35): the rekey pending, the pending
	// enrolment its answer begins (with its new WireGuard key), and the
	// grant kept for the agent.
	copyGolden(t, dir, "2de1e35", RekeyFile)
	var rk rekeyPending
	if ok, err := readJSON(dir, RekeyFile, &rk); !ok || err != nil || rk.Node != "n1" || rk.Enrolment != "e-new" || len(rk.Nonce) != 32 || rk.Begun.IsZero() {
		t.Errorf("rekey pending %+v, %v", rk, err)
	}
	copyGolden(t, dir, "2de1e35", PendingFile)
	if p, _, err := loadPending(dir); err != nil || len(p.WireGuard) != 32 || p.Held == nil || !p.Held.Replace {
		t.Errorf("a rekey's pending enrolment %+v, %v", p, err)
	}
	// A rekey's pending enrolment since 5c04c94: the new WireGuard key
	// in a file of its own, beside a pending file the release before
	// reads.
	copyGolden(t, dir, "5c04c94", PendingFile)
	copyGolden(t, dir, "5c04c94", PendingWireGuardFile)
	if p, _, err := loadPending(dir); err != nil || len(p.WireGuard) != 32 || p.Held == nil || !p.Held.Replace {
		t.Errorf("a rekey's pending enrolment, its WireGuard key beside it %+v, %v", p, err)
	}
	copyGolden(t, dir, "2de1e35", GrantedFile)
	var g granted
	if ok, err := readJSON(dir, GrantedFile, &g); !ok || err != nil || len(g.Grant) == 0 || g.AgentNKey == "" || g.Node != "n1" || len(g.ControlKey) != 32 {
		t.Errorf("granted %+v, %v", g, err)
	}
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		release string
		want    Result
	}{
		{"c4a83c5", Result{Final: true, Enrolled: true, Node: "workstation", Enrolment: "e-7f3a", Token: "t-1a2b", At: at}},
		{"9d97354", Result{Final: true, Enrolled: true, Node: "workstation", Enrolment: "e-7f3a", Token: "t-1a2b", At: at,
			Expires: at.Add(time.Hour), Replaced: "node workstation (enrolment e-0001)"}},
	} {
		copyGolden(t, dir, c.release, ResultFile)
		r, err := ReadResult(dir)
		if err != nil || r == nil {
			t.Fatalf("%s: %+v, %v", c.release, r, err)
		}
		if r.String() != c.want.String() || !r.At.Equal(c.want.At) || !r.Expires.Equal(c.want.Expires) || r.Token != c.want.Token {
			t.Errorf("%s: read %+v; want %+v", c.release, r, c.want)
		}
	}
}

// A file of a later format is refused by its number, naming both, before
// its fields are decoded strictly; the format 1 that a later release may
// write is read.
func TestALaterEnrolmentFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	copyGolden(t, dir, "c4a83c5", KeysFile)
	b, _ := os.ReadFile(filepath.Join(dir, KeysFile))
	for _, c := range []struct {
		format, err string
	}{
		{`"format": 1, `, ""},
		{`"format": 2, "a_later_field": true, `, "is in format v2, written by a later release; this executor reads formats up to v1"},
	} {
		os.WriteFile(filepath.Join(dir, KeysFile), []byte(strings.Replace(string(b), "{", "{"+c.format, 1)), 0o600)
		_, err := LoadKeys(dir)
		if (c.err == "" && err != nil) || (c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err))) {
			t.Errorf("%s: %v", c.format, err)
		}
	}
}
