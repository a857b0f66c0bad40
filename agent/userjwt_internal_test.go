package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A renewed broker credential is taken only as the control key signed it,
// for this node's enrolment, with a JWT for this node's NKey on behalf of
// an account: what a hostile broker makes up is passed over, and the
// grant's JWT stays the one signed in with. The one taken is kept in the
// agent's state, and taken again from it at the next start.
func TestARenewedCredentialOnlyFromTheControlKey(t *testing.T) {
	pub, control, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	issuer, _ := nkeys.CreateAccount()
	issuerPub, _ := issuer.PublicKey()
	stranger, _ := nkeys.CreateUser()
	strangerPub, _ := stranger.PublicKey()
	account, _ := nkeys.CreateAccount()
	accountPub, _ := account.PublicKey()
	old, _ := nkeys.CreateAccount()
	mintBy := func(by nkeys.KeyPair, subject string, onBehalf bool) string {
		uc := jwt.NewUserClaims(subject)
		uc.Name = "n1"
		if onBehalf {
			uc.IssuerAccount = accountPub
		}
		tok, err := uc.Encode(by)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	mint := func(subject string, onBehalf bool) string { return mintBy(issuer, subject, onBehalf) }
	grant := mintBy(old, userPub, true)
	dir := t.TempDir()
	st, err := openState(dir)
	if err != nil {
		t.Fatal(err)
	}
	newAgent := func() *Agent {
		return &Agent{log: slog.New(slog.DiscardHandler), state: st, hbNow: make(chan struct{}, 1),
			id: &Identity{Node: "n1", Enrolment: "e-1", ControlKey: pub, nkeyPublic: userPub, userJWT: grant, renewed: &jwtSet{}}}
	}
	a := newAgent()
	send := func(signer ed25519.PrivateKey, node, enrolment, token string) {
		payload, _ := json.Marshal(&wire.UserJWT{Node: node, Enrolment: enrolment, JWT: token, Issued: time.Now().UTC()})
		env, err := wire.Seal(signer, wire.PurposeUserJWT, payload)
		if err != nil {
			t.Fatal(err)
		}
		a.takeUserJWT(env)
	}
	renewed := mint(userPub, true)
	for _, c := range []struct {
		name                   string
		signer                 ed25519.PrivateKey
		node, enrolment, token string
	}{
		{"signed by another key", other, "n1", "e-1", renewed},
		{"for another node", control, "n2", "e-1", renewed},
		{"for an earlier enrolment", control, "n1", "e-0", renewed},
		{"for another NKey", control, "n1", "e-1", mint(strangerPub, true)},
		{"on behalf of no account", control, "n1", "e-1", mint(userPub, false)},
		{"not a JWT", control, "n1", "e-1", "eyJ.nope"},
	} {
		send(c.signer, c.node, c.enrolment, c.token)
		if got := a.id.credential(); got != grant {
			t.Fatalf("%s: taken", c.name)
		}
	}
	a.takeUserJWT([]byte("not an envelope"))
	if a.id.credential() != grant || st.get().UserJWT != "" {
		t.Fatal("something was taken from what does not verify")
	}
	send(control, "n1", "e-1", renewed)
	if a.id.credential() != renewed || a.id.credentialIssuer() != issuerPub || st.get().UserJWT != renewed {
		t.Fatalf("the control key's statement not taken: signs in with the grant's %v, state %q", a.id.credential() == grant, st.get().UserJWT)
	}
	// The next start: from the state.
	st2, err := openState(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := newAgent()
	b.state = st2
	if s := st2.get(); s.UserJWT == "" || b.jwtFor(s.UserJWT) != nil || s.JWTIssuer != issuerPub {
		t.Fatalf("the state after a restart: %+v", s)
	}
}
