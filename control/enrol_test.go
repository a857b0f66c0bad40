package control_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// machine is what a node brings to enrolment: the executor's keys (public
// halves; the test plays the executor) and the agent's NKey.
type machine struct {
	keys wire.EnrolKeys
	nkey nkeys.KeyPair
}

func newMachine(t *testing.T) *machine {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	id, _, _ := ed25519.GenerateKey(rand.Reader)
	seal := make([]byte, 1216)
	rand.Read(seal)
	wg := make([]byte, 32)
	rand.Read(wg)
	return &machine{nkey: kp, keys: wire.EnrolKeys{
		Identity: base64.StdEncoding.EncodeToString(id), Sealing: base64.StdEncoding.EncodeToString(seal),
		WireGuard: base64.StdEncoding.EncodeToString(wg), AgentNKey: pub,
	}}
}

// request makes the enrolment request tok describes, as the agent does,
// with proof made over keys (the executor's part), and returns the reply
// or the connection error.
func request(t *testing.T, s *served, text string, keys wire.EnrolKeys, mutate func(*wire.EnrolRequest)) (*wire.EnrolReply, error) {
	t.Helper()
	return requestWith(t, s, text, keys, mutate, nil)
}

// requestWith is request with headers beside it, as an agent sends its
// capability (nil: none, as a release before it).
func requestWith(t *testing.T, s *served, text string, keys wire.EnrolKeys, mutate func(*wire.EnrolRequest), h nats.Header) (*wire.EnrolReply, error) {
	t.Helper()
	tok, err := wire.ParseToken(text)
	if err != nil {
		t.Fatal(err)
	}
	cred, _ := nkeys.FromRawSeed(nkeys.PrefixByteUser, tok.Credential[:])
	pub, _ := cred.PublicKey()
	var nc *nats.Conn
	// The broker learns of a token from the registry's watch, a moment
	// after it is issued; a person pasting it is never that quick.
	for i := 0; ; i++ {
		nc, err = nats.Connect(s.url, nats.Secure(link.PinnedTLS(tok.FingerprintHex(), nil)), nats.Nkey(pub, cred.Sign),
			nats.CustomInboxPrefix(link.EnrolInbox(tok.IDString())), nats.NoReconnect())
		if err == nil {
			break
		}
		if i == 20 {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer nc.Close()
	req := wire.EnrolRequest{Token: tok.IDString(), Keys: keys, Proof: base64.StdEncoding.EncodeToString(wire.Proof(tok.Secret, tok.ID, &keys)), Hostname: "test-host.example"}
	if mutate != nil {
		mutate(&req)
	}
	data, _ := json.Marshal(&req)
	m, err := nc.RequestMsg(&nats.Msg{Subject: wire.EnrolSubjectPrefix + "." + tok.IDString(), Data: data, Header: h}, 10*time.Second)
	if err != nil {
		return nil, err
	}
	var r wire.EnrolReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return &r, nil
}

func grantOf(t *testing.T, s *served, r *wire.EnrolReply) *wire.Grant {
	t.Helper()
	if r.Refused != "" {
		t.Fatalf("refused: %s", r.Refused)
	}
	payload, err := wire.Open(s.keys.ControlPublic(), wire.PurposeGrant, r.Grant)
	if err != nil {
		t.Fatal(err)
	}
	g, err := wire.ParseGrant(payload)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// connectAs connects with a grant's JWT and the machine's NKey.
func connectAs(s *served, g *wire.Grant, m *machine) (*nats.Conn, error) {
	return nats.Connect(s.url, nats.Secure(link.PinnedTLS(s.keys.Fingerprint, nil)),
		nats.Nkey(m.keys.AgentNKey, m.nkey.Sign), nats.Token(g.UserJWT),
		nats.CustomInboxPrefix(link.SubjectsOf(g.Node).Inbox), nats.NoReconnect())
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEnrolGrantsAScopedCredential(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	text, _, err := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	r, err := request(t, s, text, m.keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := grantOf(t, s, r)
	if g.Node != "test-host" || g.AgentNKey != m.keys.AgentNKey || g.SealingKey != wire.KeyIDOf(m.keys.Sealing) || g.SeqFloor != 0 {
		t.Fatalf("grant %+v", g)
	}
	var nc *nats.Conn
	eventually(t, "the node connects with its JWT", func() bool {
		nc, err = connectAs(s, g, m)
		return err == nil
	})
	nc.Close()
}

// enrolNode enrols a node named name through a token, as a real node
// does, and returns its agent config (with the grant's JWT) and identity.
func enrolNode(t *testing.T, s *served, name string) (*agent.Config, *agent.Identity) {
	t.Helper()
	return enrolNodeLinking(t, s, name, link.LayoutByNode)
}

// enrolNodeLinking is enrolNode, its node's first link in layout l.
func enrolNodeLinking(t *testing.T, s *served, name string, l link.Layout) (*agent.Config, *agent.Identity) {
	t.Helper()
	ctx := context.Background()
	text, _, err := s.client.IssueToken(ctx, name, true, time.Hour, s.url)
	if err != nil {
		t.Fatal(err)
	}
	return enrolByToken(t, s, name, text, l)
}

// enrolByToken enrols a machine of its own with the token text, as node
// name, its first link in layout l.
func enrolByToken(t *testing.T, s *served, name, text string, l link.Layout) (*agent.Config, *agent.Identity) {
	t.Helper()
	m := newMachine(t)
	r, err := request(t, s, text, m.keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, id := identityOf(t, s, m, grantOf(t, s, r))
	eventually(t, "node "+name+" let in", func() bool {
		nc, err := agent.Dial(inLayout(id, l))
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	return cfg, id
}

// identityOf is the agent's config and identity that machine m holds
// once granted g.
func identityOf(t *testing.T, s *served, m *machine, g *wire.Grant) (*agent.Config, *agent.Identity) {
	t.Helper()
	seed, _ := m.nkey.Seed()
	cfg := &agent.Config{BrokerURL: s.url, BrokerFingerprint: s.keys.Fingerprint, ControlKey: s.keys.ControlPublicBase64(),
		Node: g.Node, Enrolment: g.Enrolment, NKeySeed: string(seed), UserJWT: g.UserJWT}
	id, err := cfg.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return cfg, id
}

func TestEnrolRefusals(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	refusedWith := func(r *wire.EnrolReply, err error, want string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Grant) != 0 || !strings.HasPrefix(r.Refused, "control: ") || !strings.Contains(r.Refused, want) {
			t.Fatalf("reply %+v, want a refusal saying %q", r, want)
		}
	}

	t.Run("used", func(t *testing.T) {
		text, _, _ := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
		m := newMachine(t)
		grantOf(t, s, must(request(t, s, text, m.keys, nil)))
		r, err := request(t, s, text, newMachine(t).keys, nil)
		refusedWith(r, err, "was used already")
		// The spent token's record keeps no secret.
		tok, _ := wire.ParseToken(text)
		e, err := s.client.KV.Get(ctx, "token."+tok.IDString())
		if err != nil || bytes.Contains(e.Value(), []byte(base64.StdEncoding.EncodeToString(tok.Secret[:]))) {
			t.Fatalf("the spent token's record: %v %s", err, e.Value())
		}
	})
	t.Run("expired", func(t *testing.T) {
		text, _, _ := s.client.IssueToken(ctx, "", true, time.Second, s.url)
		time.Sleep(2100 * time.Millisecond)
		r, err := request(t, s, text, newMachine(t).keys, nil)
		refusedWith(r, err, "expired at")
	})
	t.Run("a key substituted after the proof", func(t *testing.T) {
		text, _, _ := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
		m := newMachine(t)
		thief := newMachine(t)
		for _, swap := range []func(*wire.EnrolKeys){
			func(k *wire.EnrolKeys) { k.Sealing = thief.keys.Sealing },
			func(k *wire.EnrolKeys) { k.WireGuard = thief.keys.WireGuard },
			func(k *wire.EnrolKeys) { k.Identity = thief.keys.Identity },
			func(k *wire.EnrolKeys) { k.AgentNKey = thief.keys.AgentNKey },
		} {
			r, err := request(t, s, text, m.keys, func(req *wire.EnrolRequest) { swap(&req.Keys) })
			refusedWith(r, err, "proof does not verify")
		}
		// None of those spent it: the genuine request still enrols.
		grantOf(t, s, must(request(t, s, text, m.keys, nil)))
	})
	t.Run("another token's id", func(t *testing.T) {
		text, _, _ := s.client.IssueToken(ctx, "", true, time.Hour, s.url)
		r, err := request(t, s, text, newMachine(t).keys, func(req *wire.EnrolRequest) { req.Token = "0011223344556677" })
		refusedWith(r, err, "on the subject of token")
	})
}

// The request that spent a token, made again (its agent never had the
// answer: a control side busy with many enrolments, a connection lost),
// is granted again, for the enrolment it made — not told the token was
// used, which ended the enrolment while the registry held the node
// enrolled on keys no machine used. Another machine's request is still
// refused, and so is the same one once the node was revoked.
func TestTheRequestThatSpentATokenIsGrantedAgain(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	for _, isNew := range []bool{true, false} {
		name := "fresh"
		if !isNew {
			name = "again"
			if _, _, err := s.client.AddNode(ctx, name, s.url); err != nil {
				t.Fatal(err)
			}
		}
		text, _, err := s.client.IssueToken(ctx, name, isNew, time.Hour, s.url)
		if err != nil {
			t.Fatal(err)
		}
		m := newMachine(t)
		first := grantOf(t, s, must(request(t, s, text, m.keys, nil)))
		second := grantOf(t, s, must(request(t, s, text, m.keys, nil)))
		if second.Node != first.Node || second.Enrolment != first.Enrolment || second.AgentNKey != m.keys.AgentNKey || second.SeqFloor != first.SeqFloor {
			t.Fatalf("%s: granted again as %+v, first as %+v", name, second, first)
		}
		rec, _, err := s.client.Node(ctx, name)
		if err != nil || rec.Enrolment != first.Enrolment || rec.NKey != m.keys.AgentNKey {
			t.Fatalf("%s: the record after the request made again: %+v %v", name, rec, err)
		}
		if r, err := request(t, s, text, newMachine(t).keys, nil); err != nil || len(r.Grant) != 0 || !strings.Contains(r.Refused, "was used already") {
			t.Fatalf("%s: another machine with the spent token: %+v %v", name, r, err)
		}
		if _, _, err := s.client.Revoke(ctx, name, "test"); err != nil {
			t.Fatal(err)
		}
		if r, err := request(t, s, text, m.keys, nil); err != nil || len(r.Grant) != 0 || !strings.Contains(r.Refused, "was used already") {
			t.Fatalf("%s: the same request after the node's revocation: %+v %v", name, r, err)
		}
	}
}

func must(r *wire.EnrolReply, err error) *wire.EnrolReply {
	if err != nil {
		panic(err)
	}
	return r
}

// A token's one-time credential asks for its enrolment and does nothing
// else: no declarations, reports, JetStream, archives, other tokens.
func TestTokenCredentialCanOnlyEnrol(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	enrolNode(t, s, "beta")
	text, _, _ := s.client.IssueToken(context.Background(), "", true, time.Hour, s.url)
	tok, _ := wire.ParseToken(text)
	cred, _ := nkeys.FromRawSeed(nkeys.PrefixByteUser, tok.Credential[:])
	pub, _ := cred.PublicKey()
	errs := make(chan error, 64)
	var nc *nats.Conn
	var err error
	eventually(t, "the token's credential is let in", func() bool {
		nc, err = nats.Connect(s.url, nats.Secure(link.PinnedTLS(tok.FingerprintHex(), nil)), nats.Nkey(pub, cred.Sign),
			nats.CustomInboxPrefix(link.EnrolInbox(tok.IDString())), nats.NoReconnect(),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		return err == nil
	})
	defer nc.Close()
	refused := permissionRefused(t, nc, errs)
	for _, subj := range []string{"mesh.decl.beta", "mesh.>", "_INBOX.beta.>", "_INBOX.>", "_INBOX.enrol-0011223344556677.>"} {
		nc.SubscribeSync(subj)
		refused("subscribe", subj)
	}
	for _, subj := range []string{"mesh.decl.beta", "mesh.report.beta", "mesh.heartbeat.beta", "mesh.api.DIRECT.GET.MESH_DECL.mesh.decl.beta",
		"mesh.notice.beta", link.ArchiveGet, "$JS.API.STREAM.INFO.MESH_DECL", "mesh.enrol.0011223344556677", "mesh.enrol.*"} {
		nc.Publish(subj, []byte("{}"))
		refused("publish", subj)
	}
}

// Revocation: `node revoke` and a token issued --node both end the node's
// identity at the broker, at once, connected or not; the re-enrolled node
// gets in with its new identity and the old one stays out.
func TestRevocation(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx := context.Background()
	_, id := enrolNode(t, s, "gamma")
	_, bystander := enrolNode(t, s, "delta")
	bconn, err := agent.Dial(bystander, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer bconn.Close()
	closed := make(chan struct{})
	nc, err := agent.Dial(id, nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := s.client.RevokeNode(ctx, "gamma", "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked node's connection was not closed")
	}
	eventually(t, "the revoked identity refused", func() bool {
		_, err := agent.Dial(id)
		var le *agent.LinkError
		return errors.As(err, &le) && le.Reason == agent.LinkAuthorization
	})
	// Revoking one node leaves the others be.
	time.Sleep(200 * time.Millisecond)
	if !bconn.IsConnected() {
		t.Fatal("revoking gamma disconnected delta")
	}

	// Re-enrolment: a token --node revokes what the record had (here,
	// already nothing) and the new machine gets in as gamma.
	text, rec, err := s.client.IssueToken(ctx, "gamma", false, time.Hour, s.url)
	if err != nil || rec.New || rec.Node != "gamma" {
		t.Fatalf("token --node: %v %+v", err, rec)
	}
	m := newMachine(t)
	g := grantOf(t, s, must(request(t, s, text, m.keys, nil)))
	if g.Node != "gamma" || g.Enrolment == id.Enrolment {
		t.Fatalf("re-enrolment grant %+v (old enrolment %s)", g, id.Enrolment)
	}
	eventually(t, "the re-enrolled node let in", func() bool {
		nc, err := connectAs(s, g, m)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	if _, err := agent.Dial(id); err == nil {
		t.Fatal("the old identity got in after re-enrolment")
	}
	time.Sleep(200 * time.Millisecond)
	if !bconn.IsConnected() {
		t.Fatal("re-enrolling gamma disconnected delta")
	}

	// A JWT for the right NKey but another node name is refused,
	// and so is one the nodes' account did not sign.
	forged, _ := s.client.UserJWT("beta", m.keys.AgentNKey)
	if _, err := connectAs(s, &wire.Grant{Node: "gamma", UserJWT: forged}, m); err == nil {
		t.Fatal("a JWT naming another node was let in")
	}
	other, _ := nkeys.CreateAccount()
	uc, _ := jwt.DecodeUserClaims(g.UserJWT)
	selfMade, _ := uc.Encode(other)
	if _, err := connectAs(s, &wire.Grant{Node: "gamma", UserJWT: selfMade}, m); err == nil {
		t.Fatal("a JWT signed by another account was let in")
	}

	// A token --node while the node is live revokes it then and there.
	live, err := connectAs(s, g, m)
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	live.SetClosedHandler(func(*nats.Conn) { close(gone) })
	live.SetReconnectHandler(nil)
	if _, _, err := s.client.IssueToken(ctx, "gamma", false, time.Hour, s.url); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		if live.IsConnected() {
			t.Fatal("issuing a token --node left the node's live identity connected")
		}
	}
}
