package serve

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
	"golang.org/x/sys/unix"
)

// A declaration refused because the state's disk is full is not applied,
// and the status the agent reports upward says the last one that was —
// where the control side counted the refused one as applied, and its
// view of the node stayed wrong until the next declaration.
func TestAFullStateDiskRefusesAndStatusKeepsTheLastApplied(t *testing.T) {
	e := newEnv(t, nobody, true)
	c := e.dial()
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 1, file("motd", "v1\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("%+v", v)
	}
	e.stateOnTmpfs("1m")
	c = e.dial()
	f, err := os.Create(filepath.Join(e.state, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	_, v := e.push(c, e.seal(e.decl("n1", "e-1", 2, file("motd", "v2\n"))))
	if v.Outcome != shapes.Refused {
		t.Fatalf("a declaration on a full state disk: %+v", v)
	}
	if err := c.Write(wire.KindStatus, &wire.Status{}); err != nil {
		t.Fatal(err)
	}
	k, body, err := c.Read()
	if err != nil || k != wire.KindStatusReply {
		t.Fatalf("%v %v", k, err)
	}
	if st := body.(*wire.StatusReply); st.Seq != 1 || st.Outcome == shapes.Refused {
		t.Fatalf("status after a refused declaration says seq %d %s, want 1 as applied (or reconciled since)", st.Seq, st.Outcome)
	}
	// And so does the summary root's mesh-executor status reads (written
	// in place on a full disk, it could have said the refused one).
	st, err := store.Open(e.state)
	if err != nil {
		t.Fatal(err)
	}
	var sum store.ReportSummary
	if data, err := st.Report(store.Link); err != nil || json.Unmarshal(data, &sum) != nil || sum.Seq != 1 || sum.Outcome == shapes.Refused {
		t.Fatalf("the summary after a refused declaration: %s %v", data, err)
	}
	// Space again: the same declaration is applied. The filler's pages are
	// given back once no one holds it open; the disk is waited for until
	// it says so (once, under make test's load, the next write still met
	// a full disk).
	os.Remove(filepath.Join(e.state, "filler"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var st unix.Statfs_t
		if err := unix.Statfs(e.state, &st); err != nil {
			t.Fatal(err)
		}
		if free := st.Bavail * uint64(st.Bsize); free >= 512<<10 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the state disk has %d bytes free 10 s after the filler's removal", free)
		}
	}
	if _, v := e.push(c, e.seal(e.decl("n1", "e-1", 2, file("motd", "v2\n")))); v.Outcome != shapes.Applied {
		t.Fatalf("with space again: %+v", v)
	}
}

// A rotation the executor cannot keep (its file not written: a full
// disk, here a directory where its temporary file goes) is no refusal:
// the request fails, so the agent asks again and leaves what it carried
// unjudged, rather than being answered "refused" and settling it; the
// same rotation is taken once it can be kept.
func TestARotationNotKeptIsAskedAgain(t *testing.T) {
	e := newEnv(t, nobody, true)
	_, next, _ := ed25519.GenerateKey(rand.Reader)
	env, err := wire.SealRotation(e.priv, next, wire.KeyRotation{Node: "n1", Enrolment: "e-1", Seq: 1, By: wire.ByKey, From: wire.KeyID(e.pub), Issued: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	ask := func() (wire.Kind, any) {
		c := e.dial()
		if err := c.Write(wire.KindKeyRotation, &wire.KeyRotations{Envelopes: [][]byte{env}}); err != nil {
			t.Fatal(err)
		}
		k, body, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		return k, body
	}
	blocker := filepath.Join(e.state, identity.KeysFile+".tmp")
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	if k, body := ask(); k != wire.KindError {
		t.Fatalf("a rotation that could not be kept answered %s %+v; want the request failed", k, body)
	}
	os.Remove(blocker)
	k, body := ask()
	r, ok := body.(*wire.KeyRotationReply)
	if k != wire.KindKeyRotationReply || !ok || r.Refused != "" || r.Taken != 1 || !ed25519.PublicKey(r.ControlKey).Equal(next.Public()) {
		t.Fatalf("offered again once it can be kept: %s %+v", k, body)
	}
}

// stateOnTmpfs moves the stopped daemon's state, as it is, onto a tmpfs of
// size (to fill), and starts the daemon again on it.
func (e *env) stateOnTmpfs(size string) {
	e.t.Helper()
	e.stop()
	saved := map[string][]byte{}
	filepath.Walk(e.state, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			saved[p], _ = os.ReadFile(p)
		}
		return nil
	})
	if err := unix.Mount("tmpfs", e.state, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		e.t.Fatalf("a tmpfs to fill (make test runs as root, which may mount one): %v", err)
	}
	e.t.Cleanup(func() { unix.Unmount(e.state, unix.MNT_DETACH) })
	for p, b := range saved {
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			e.t.Fatal(err)
		}
	}
	e.start(Config{StateDir: e.state, Version: "test", Build: "b1", AgentUID: nobody})
}
