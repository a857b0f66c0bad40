package agent

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// Config is the agent's config file, written by `mesh-control node add`
// (JSON, mode 0600; it holds the node's NKey seed). Field names are exact:
//
//	{
//	  "broker_url": "tls://127.0.0.1:4222",
//	  "broker_fingerprint": "<sha-256 of the broker certificate, hex>",
//	  "control_key": "<ed25519 public key of the control plane, base64>",
//	  "node": "web1",
//	  "enrolment": "e-…",
//	  "nkey_seed": "SU…"
//	}
//
// Enrolment writes it (with "user_jwt", the broker credential of the
// grant), from a seed the agent made itself and never sent anywhere. A
// node registered by hand (`mesh-control node add`) gets it from the
// control side instead, seed included.
type Config struct {
	BrokerURL         string `json:"broker_url"`
	BrokerFingerprint string `json:"broker_fingerprint"`
	ControlKey        string `json:"control_key"`
	Node              string `json:"node"`
	Enrolment         string `json:"enrolment"`
	NKeySeed          string `json:"nkey_seed"`
	// UserJWT is the broker credential a grant carries (enrolment writes
	// it); without one the agent authenticates with its NKey alone, as a
	// node registered by hand does.
	UserJWT string `json:"user_jwt,omitempty"`
}

// Identity is a checked Config: what the agent links and verifies with.
type Identity struct {
	BrokerURL  string
	Pin        string // normalised fingerprint
	ControlKey ed25519.PublicKey
	Node       string
	Enrolment  string
	// Layout is how the node's subjects are named (link.Layout): this
	// agent's own, link.LayoutByNode; Subjects are its names in it.
	Layout     link.Layout
	Subjects   link.Subjects
	nkey       nkeys.KeyPair
	signer     *link.Signer // nkey's, derived once
	nkeyPublic string
	userJWT    string
	// userJWTIssuer is the key that issued userJWT, read once: the
	// heartbeat names it every period.
	userJWTIssuer string
	// renewed, when set, is the user JWT the control side sent in place
	// of userJWT (wire.UserJWT: the nodes' account key rotated), kept in
	// the agent's state; shared by the copies of the identity.
	renewed *jwtSet
	// pins, when set, are the broker certificates a rotation announced
	// (wire.BrokerPins), accepted in place of Pin; shared by the copies
	// of the identity (inLayout).
	pins *pinSet
}

type pinSet struct{ p atomic.Pointer[[]string] }

// jwtSet holds a user JWT and the key that issued it.
type jwtSet struct{ p atomic.Pointer[[2]string] }

// credential is the user JWT the node signs in with now: the one the
// control side renewed, or its grant's.
func (id *Identity) credential() string {
	if id.renewed != nil {
		if p := id.renewed.p.Load(); p != nil {
			return p[0]
		}
	}
	return id.userJWT
}

// credentialIssuer is the key that issued credential ("": none, or not a
// JWT).
func (id *Identity) credentialIssuer() string {
	if id.renewed != nil {
		if p := id.renewed.p.Load(); p != nil {
			return p[1]
		}
	}
	return id.userJWTIssuer
}

// issuerOf is the key that issued a user JWT, "" when it is none.
func issuerOf(token string) string {
	if uc, err := jwt.DecodeUserClaims(token); err == nil {
		return uc.Issuer
	}
	return ""
}

// setJWT makes token, issued by issuer, the user JWT the node signs in
// with from its next connection.
func (id *Identity) setJWT(token, issuer string) {
	if id.renewed != nil {
		id.renewed.p.Store(&[2]string{token, issuer})
	}
}

// Pins are the broker certificates this node accepts now: those the
// control side last announced, or the one its enrolment pinned.
func (id *Identity) Pins() []string {
	if id.pins != nil {
		if p := id.pins.p.Load(); p != nil && len(*p) > 0 {
			return *p
		}
	}
	return []string{id.Pin}
}

// setPins makes pins the certificates accepted from the next handshake.
func (id *Identity) setPins(pins []string) {
	if id.pins != nil {
		id.pins.p.Store(&pins)
	}
}

// NKeyPublic is the public half of the node's NKey (the broker's user name).
func (id *Identity) NKeyPublic() string { return id.nkeyPublic }

// ErrNoIdentity: no config file; the agent stays hosted.
var ErrNoIdentity = errors.New("no identity")

// LoadConfig reads and checks the config at path. A missing file is
// ErrNoIdentity. A file that group or others may read is refused: it holds
// the node's secret.
func LoadConfig(path string) (*Identity, error) {
	if path == "" {
		return nil, ErrNoIdentity
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoIdentity, path)
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", statedir.ExplainAccess("read", path, err,
			"start the agent as root, which reads it before dropping to --user, or make it that user's (0600)"))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("config %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("config %s has mode %04o: it holds the node's NKey seed and must not be readable by group or others (chmod 0600)", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if len(data) > 64<<10 {
		return nil, fmt.Errorf("config %s: larger than 64 KiB", path)
	}
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("config %s does not read (%w): cut short or damaged (written at the enrolment); move it aside and start the agent again — with no config it asks the executor, which hands back the grant it recorded for this agent's key — or, if the executor has none, enrol again (mesh-executor enrol)", path, err)
	}
	id, err := c.Identity()
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return id, nil
}

// Identity checks every field of c.
func (c *Config) Identity() (*Identity, error) {
	// One URL, or a cluster's servers as a comma-separated list (the
	// client also learns the others from whichever it reaches).
	for _, one := range strings.Split(c.BrokerURL, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("broker_url %q is not a URL with a host (or a comma-separated list of them)", c.BrokerURL)
		}
		if u.Scheme != "tls" && u.Scheme != "nats" {
			return nil, fmt.Errorf("broker_url %q: the scheme is tls:// (TLS is always required)", c.BrokerURL)
		}
	}
	pin, err := link.ParseFingerprint(c.BrokerFingerprint)
	if err != nil {
		return nil, fmt.Errorf("broker_fingerprint: %w", err)
	}
	ck, err := base64.StdEncoding.DecodeString(c.ControlKey)
	if err != nil || len(ck) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("control_key is not a base64 Ed25519 public key")
	}
	if err := link.ValidNodeName(c.Node); err != nil {
		return nil, err
	}
	if c.Enrolment == "" || len(c.Enrolment) > 128 {
		return nil, fmt.Errorf("enrolment %q: 1 to 128 bytes", c.Enrolment)
	}
	kp, err := nkeys.FromSeed([]byte(c.NKeySeed))
	if err != nil {
		return nil, fmt.Errorf("nkey_seed: %v", err)
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return nil, fmt.Errorf("nkey_seed is not a user NKey seed")
	}
	signer, err := link.NewSigner(kp)
	if err != nil {
		return nil, err
	}
	return &Identity{
		BrokerURL:     c.BrokerURL,
		Pin:           pin,
		ControlKey:    ed25519.PublicKey(ck),
		Node:          c.Node,
		Enrolment:     c.Enrolment,
		Layout:        link.LayoutByNode,
		Subjects:      link.NodeSubjects(c.Node, link.LayoutByNode),
		nkey:          kp,
		signer:        signer,
		nkeyPublic:    pub,
		userJWT:       c.UserJWT,
		userJWTIssuer: issuerOf(c.UserJWT),
		renewed:       &jwtSet{},
		pins:          &pinSet{},
	}, nil
}

// inLayout is a copy of id with its subjects in layout l.
func (id *Identity) inLayout(l link.Layout) *Identity {
	c := *id
	c.Layout, c.Subjects = l, link.NodeSubjects(c.Node, l)
	return &c
}
