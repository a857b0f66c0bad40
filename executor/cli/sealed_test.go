package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// enrolAs enrols the executor of state as node through the real path
// (Begin, an offer, a grant signed by a control key the token pins) and
// returns the sealing public key it made.
func enrolAs(t *testing.T, state, node string) []byte {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	tok := &wire.Token{Expires: time.Now().Add(time.Hour), BrokerURL: "tls://broker.example:4222", ControlKey: pub}
	rand.Read(tok.ID[:])
	rand.Read(tok.Secret[:])
	if err := enrol.Begin(state, tok); err != nil {
		t.Fatal(err)
	}
	nkey := "U" + strings.Repeat("A", 55)
	offer, err := enrol.Offer(state, nkey, "host", nil, nil)
	if err != nil || offer == nil {
		t.Fatalf("offer: %+v %v", offer, err)
	}
	payload, _ := json.Marshal(&wire.Grant{Node: node, Enrolment: "e-1", Token: tok.IDString(),
		IdentityKey: wire.KeyIDOf(offer.Keys.Identity), SealingKey: wire.KeyIDOf(offer.Keys.Sealing),
		WireGuardKey: wire.KeyIDOf(offer.Keys.WireGuard), AgentNKey: nkey, UserJWT: "jwt", Issued: time.Now().UTC()})
	grant, err := wire.Seal(priv, wire.PurposeGrant, payload)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enrol.Accept(state, grant); err != nil {
		t.Fatal(err)
	}
	sealing, _ := base64.StdEncoding.DecodeString(offer.Keys.Sealing)
	return sealing
}

// A rescue file may carry sealed content: on an enrolled host it opens
// with the node's key for the node and sequence the file names; on a
// hosted one, or bound to another sequence, the file is refused whole.
// Neither the plan nor the report prints the plaintext.
func TestRescueApplyOfSealedContent(t *testing.T) {
	const secret = "rescue-s3cret-1414\n"
	d := base(t)
	state, target := filepath.Join(d, "state"), filepath.Join(d, "token")
	localFile := func(name string, pub []byte, seq, sealedFor uint64) string {
		s, err := wire.SealContent(pub, "n1", sealedFor, "m", "token", []byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		doc := fmt.Sprintf(`{"version":1,"node":"n1","seq":%d,"resources":[{"module":"m","id":"token","type":"file","path":%q,"sealed":%q,"mode":"0600"}]}`, seq, target, s)
		return write(t, filepath.Join(d, name), doc, 0o600)
	}
	run := func(args ...string) (int, string) {
		var out, errw bytes.Buffer
		code := Main("test", append([]string{args[0], "--state", state}, args[1:]...), &out, &errw)
		text := out.String() + errw.String()
		if strings.Contains(text, "s3cret") {
			t.Fatalf("%v printed the sealed content:\n%s", args, text)
		}
		return code, text
	}

	// Hosted: no key to open it with.
	other, _ := wire.SealedKEM().GenerateKey()
	if code, out := run("apply", localFile("hosted.json", other.PublicKey().Bytes(), 7, 7)); code != ExitRefused ||
		!strings.Contains(out, "sealed content for m.token could not be opened: this host has no sealing key") {
		t.Fatalf("hosted: exit %d\n%s", code, out)
	}

	pub := enrolAs(t, state, "n1")
	good := localFile("good.json", pub, 7, 7)
	if code, out := run("plan", good); code != ExitApplied || !strings.Contains(out, "sealed, ") {
		t.Fatalf("plan: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatal("plan wrote the file")
	}
	if code, out := run("apply", good); code != ExitApplied {
		t.Fatalf("apply: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(target); string(b) != secret {
		t.Fatalf("written %q", b)
	}
	os.Remove(target)
	if code, out := run("apply", localFile("moved.json", pub, 8, 7)); code != ExitRefused || !strings.Contains(out, "does not open") {
		t.Fatalf("sealed for another sequence: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatal("a refused rescue file wrote the file")
	}
}
