package control

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// An existing broker in NATS operator mode (broker-config --resolver).
//
// Isolation between nodes needs each node in an account of its own (see
// link's package comment: a NATS permission never limits the reply subject
// a request names, and the answer lands in the requester's account). A
// broker configured from a file learns of a new account by a reload, and
// nats-server 2.15.2 wires a reload-introduced account's imports wrongly
// (AccountsConfig says how). NATS' own way for accounts that come and go
// at run time is operator mode: every account is a JWT the operator key
// signs, pushed to the servers' account resolver over the system account
// ($SYS.REQ.CLAIMS.UPDATE), which a cluster's servers pass among
// themselves — no file, no reload. So here:
//
//   - the operator's key is made once in the key directory (MakeOperator),
//     with the system and CONTROL accounts' public keys and the control
//     side's signing key; the configuration preloads those two accounts,
//     serve pushes them again when the signing keys they list change, and
//     serve and each command sign in to them as users whose JWTs that key
//     issues;
//   - each node has an account of its own (NodeAccountID), pushed by serve
//     when it enrols and again whenever its record changes: it imports
//     only its own subjects from CONTROL, lists the nodes' account key
//     (nodes-account.nk) as its signing key, and revokes every user JWT
//     issued before its current enrolment — or all of them once the node
//     is revoked;
//   - each usable enrolment token has an account of its own too
//     (TokenAccountID): the token's one-time credential as an account key,
//     importing the token's enrolment subject alone, expiring with the
//     token; the agent signs its own user JWT with it (a JWT's permissions
//     are its issuer's to write, so the account, never the permissions, is
//     the fence), and serve deletes the account once the token is revoked
//     or past its grace.

// The key directory's files of an existing broker in operator mode. The
// operator's key (0600) signs every account. The system account and
// CONTROL are kept by their public halves alone: their identity keys are
// made, named and forgotten, for an account's identity key issues its
// users for ever, and an account's ID cannot change without moving its
// streams; the users serve signs in with are issued by the control side's
// signing key (FileBrokerSigning, 0600), which both accounts list, and
// which rotates (account-key rotate) as the nodes' account key does.
const (
	FileBrokerOperator   = "broker-operator.nk"
	FileBrokerSystemPub  = "broker-system.pub"
	FileBrokerControlPub = "broker-control.pub"
	FileBrokerSigning    = "broker-signing.nk"
	// The identity seeds a key directory of an earlier build kept: read
	// for their public halves, and removed by MakeOperator.
	fileBrokerSystemSeed  = "broker-system.nk"
	fileBrokerControlSeed = "broker-control.nk"
)

// accountsDir is the resolver's directory beside a server's JetStream
// store: one JWT file per account.
const accountsDir = "accounts"

// Operator is the key set of a broker in operator mode.
type Operator struct {
	// op is the operator's key: the one in force signs; one announced
	// (operator-key rotate) is trusted beside it by the servers'
	// configuration until the switch puts it in force.
	op                          *signingKey
	SystemPublic, ControlPublic string
	// signing issues the users of the system account and CONTROL.
	signing *signingKey
	// session is this process's user key: serve and each command sign in
	// with a key of their own, made at start and never written, under a
	// JWT signing issues (userJWT).
	sessionOnce sync.Once
	session     nkeys.KeyPair
}

// loadOperator reads the key directory's operator keys: nil without an
// error when it has none (the broker is the embedded one, or configured
// from a file).
func loadOperator(dir string) (*Operator, error) {
	if _, err := os.Stat(filepath.Join(dir, FileBrokerOperator)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	o := &Operator{}
	var err error
	if o.op, err = loadKeyPair(dir, FileBrokerOperator, nkeys.PrefixByteOperator, false); err != nil {
		return nil, fmt.Errorf("the broker's operator keys: %w", err)
	}
	for _, f := range []struct {
		pub, seed string
		id        *string
	}{
		{FileBrokerSystemPub, fileBrokerSystemSeed, &o.SystemPublic},
		{FileBrokerControlPub, fileBrokerControlSeed, &o.ControlPublic},
	} {
		if *f.id, err = accountPublic(dir, f.pub, f.seed); err != nil {
			return nil, fmt.Errorf("the broker's operator keys: %w", err)
		}
	}
	if o.signing, err = loadSigningKey(dir, FileBrokerSigning, false); err != nil {
		return nil, fmt.Errorf("the broker's operator keys: %w (broker-config --resolver makes it)", err)
	}
	return o, nil
}

// accountPublic reads an account's public key from its file, or from the
// identity seed an earlier build kept instead.
func accountPublic(dir, pubFile, seedFile string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, pubFile))
	if errors.Is(err, fs.ErrNotExist) {
		seed, serr := readKeyFile(dir, seedFile)
		if errors.Is(serr, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", pubFile, err)
		}
		if serr != nil {
			return "", serr
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		if err != nil {
			return "", fmt.Errorf("%s: %w", seedFile, err)
		}
		pub, _ := kp.PublicKey()
		b = []byte(pub)
	} else if err != nil {
		return "", err
	}
	pub := strings.TrimSpace(string(b))
	if !nkeys.IsValidPublicAccountKey(pub) {
		return "", fmt.Errorf("%s: not an account's public key", pubFile)
	}
	return pub, nil
}

// MakeOperator makes the key directory's operator keys where it has none,
// and loads them. Made once: every server and every serve of the mesh
// trusts the same operator. An identity seed an earlier build kept is
// replaced by its public half.
func MakeOperator(dir string) (*Operator, error) {
	for _, f := range []struct{ pub, seed string }{
		{FileBrokerSystemPub, fileBrokerSystemSeed},
		{FileBrokerControlPub, fileBrokerControlSeed},
	} {
		if _, err := os.Lstat(filepath.Join(dir, f.pub)); err == nil {
			// Only a public key that reads stands for the seed.
			if _, err := accountPublic(dir, f.pub, f.seed); err != nil {
				return nil, err
			}
			os.Remove(filepath.Join(dir, f.seed))
			continue
		}
		var pub string
		if _, err := os.Lstat(filepath.Join(dir, f.seed)); errors.Is(err, fs.ErrNotExist) {
			// None yet: an account key made, named, and forgotten.
			kp, err := nkeys.CreateAccount()
			if err != nil {
				return nil, err
			}
			pub, _ = kp.PublicKey()
		} else if pub, err = accountPublic(dir, f.pub, f.seed); err != nil {
			// A seed there that does not read is never replaced by a new
			// account: CONTROL's ID names its streams' directory.
			return nil, err
		}
		// Written whole or not at all: a public key cut short by a crash
		// would stand for a seed removed.
		if err := statedir.WriteBytes(filepath.Join(dir, f.pub), []byte(pub+"\n"), 0o644); err != nil {
			return nil, err
		}
		os.Remove(filepath.Join(dir, f.seed))
	}
	if _, err := loadSigningKey(dir, FileBrokerSigning, true); err != nil {
		return nil, err
	}
	// The operator's last: its presence says the set is whole.
	if _, err := loadKeyPair(dir, FileBrokerOperator, nkeys.PrefixByteOperator, true); err != nil {
		return nil, err
	}
	return loadOperator(dir)
}

// OperatorPublic is the operator's key in force.
func (o *Operator) OperatorPublic() string {
	pub, _ := o.signer().PublicKey()
	return pub
}

// signer is the operator's key that signs the accounts now, as its files
// say: a serve follows a switch another made.
func (o *Operator) signer() nkeys.KeyPair {
	o.op.refresh()
	return o.op.current()
}

// OperatorJWTs are the operators the servers trust, each self-signed and
// naming the system account: the one in force, and the one announced.
func (o *Operator) OperatorJWTs() ([]string, error) {
	var jwts []string
	for _, kp := range []nkeys.KeyPair{o.signer(), o.op.announced()} {
		if kp == nil {
			continue
		}
		pub, _ := kp.PublicKey()
		oc := jwt.NewOperatorClaims(pub)
		oc.Name = "nox-mesh"
		oc.SystemAccount = o.SystemPublic
		token, err := oc.Encode(kp)
		if err != nil {
			return nil, err
		}
		jwts = append(jwts, token)
	}
	return jwts, nil
}

// systemAccountClaims is the system account's: serve's second connection
// pushes and deletes accounts through it.
func (o *Operator) systemAccountClaims() *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(o.SystemPublic)
	ac.Name = "SYS"
	ac.SigningKeys.Add(o.signing.accepted()...)
	return ac
}

// SystemAccountJWT is the system account's claims, signed.
func (o *Operator) SystemAccountJWT() (string, error) {
	return o.systemAccountClaims().Encode(o.signer())
}

// controlAccountClaims is CONTROL's: JetStream, and the services and
// notices the nodes' and tokens' accounts import. Its exports are public:
// only the operator signs an account, and each account it signs imports
// only its own node's (or token's) subjects — the importing account's
// JWT, not the export, names which.
func (o *Operator) controlAccountClaims() *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(o.ControlPublic)
	ac.Name = link.AccountControl
	ac.SigningKeys.Add(o.signing.accepted()...)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	exported := map[string]bool{}
	for _, si := range link.ServiceImports {
		if exported[si.Subject] {
			continue
		}
		exported[si.Subject] = true
		ac.Exports.Add(&jwt.Export{Type: jwt.Service, Subject: jwt.Subject(si.Subject)})
	}
	ac.Exports.Add(&jwt.Export{Type: jwt.Service, Subject: jwt.Subject(link.EnrolService), ResponseType: jwt.ResponseTypeSingleton})
	for _, n := range link.Notices {
		ac.Exports.Add(&jwt.Export{Type: jwt.Stream, Subject: jwt.Subject(n.Subject)})
	}
	ac.AddMapping(jwt.Subject(link.ReportMapping.From), jwt.WeightedMapping{Subject: jwt.Subject(link.ReportMapping.To)})
	return ac
}

// ControlAccountJWT is CONTROL's claims, signed.
func (o *Operator) ControlAccountJWT() (string, error) {
	return o.controlAccountClaims().Encode(o.signer())
}

// userJWT is a user JWT of this process's session key in account (the
// system account's or CONTROL's), issued by the control side's signing key
// in force as its files say now: a serve reconnecting after another
// carried out a rotation's switch signs in with the key switched to. Not
// the key announced: a JWT is issued at each sign-in, so none needs to
// outlive the switch, and one of the key announced would be refused by a
// broker that has not yet taken the accounts listing it.
func (o *Operator) userJWT(account, name string) (string, error) {
	if err := o.signing.refresh(); err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(o.sessionPublic())
	uc.Name = name
	uc.IssuerAccount = account
	return uc.Encode(o.signing.current())
}

// sessionKey is this process's user key (see Operator.session).
func (o *Operator) sessionKey() nkeys.KeyPair {
	o.sessionOnce.Do(func() {
		kp, err := nkeys.CreateUser()
		if err != nil {
			panic(fmt.Sprintf("a user NKey: %v", err)) // crypto/rand failed
		}
		o.session = kp
	})
	return o.session
}

func (o *Operator) sessionPublic() string {
	pub, _ := o.sessionKey().PublicKey()
	return pub
}

// signIn is a connection's sign-in to account as name.
func (o *Operator) signIn(account, name string) nats.Option {
	return nats.UserJWT(func() (string, error) { return o.userJWT(account, name) }, o.sessionKey().Sign)
}

// NodeAccountID is the public key naming node's account. It is derived
// from the node's name, not made: the registry keeps nothing more, and no
// one holds its private half (it is a hash, not a key anyone made), so
// only the signing key the account lists issues its users.
func NodeAccountID(node string) string {
	h := sha256.Sum256([]byte("nox-mesh-host node account\x00" + node))
	b, _ := nkeys.Encode(nkeys.PrefixByteAccount, h[:])
	return string(b)
}

// TokenAccountID is the account of a token whose one-time credential is
// the user NKey credential: the same Ed25519 key, named as an account.
func TokenAccountID(credential string) (string, error) {
	raw, err := nkeys.Decode(nkeys.PrefixByteUser, []byte(credential))
	if err != nil {
		return "", fmt.Errorf("token credential: %w", err)
	}
	b, err := nkeys.Encode(nkeys.PrefixByteAccount, raw)
	return string(b), err
}

// nodeAccountClaims is n's account as the registry has it now. Every user
// JWT issued up to the second before its current enrolment is revoked
// (the grant's JWT is issued after the record is written, so it is not);
// a revoked node's account revokes all and lists no signing key.
func (k *Keys) nodeAccountClaims(n *NodeRecord) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(NodeAccountID(n.Name))
	ac.Name = n.Name
	if n.NKey == "" {
		ac.Revocations = jwt.RevocationList{}
		ac.Revocations.Revoke(jwt.All, time.Unix(max(n.Revoked.Unix(), n.Enrolled.Unix(), 1), 0))
		return ac
	}
	ac.SigningKeys.Add(k.nodes.accepted()...)
	if !n.Enrolled.IsZero() {
		ac.Revocations = jwt.RevocationList{}
		ac.Revocations.Revoke(jwt.All, time.Unix(n.Enrolled.Unix()-1, 0))
	}
	services, notices := link.NodeImports(n.Name)
	for _, si := range services {
		ac.Imports.Add(&jwt.Import{Type: jwt.Service, Account: k.Operator.ControlPublic, Subject: jwt.Subject(si.Subject), LocalSubject: jwt.RenamingSubject(si.To)})
	}
	for _, subj := range notices {
		ac.Imports.Add(&jwt.Import{Type: jwt.Stream, Account: k.Operator.ControlPublic, Subject: jwt.Subject(subj)})
	}
	return ac
}

// tokenAccountClaims is t's account while t may be used: its enrolment
// request and nothing else, until the token's last moment.
func (k *Keys) tokenAccountClaims(t *TokenRecord) (*jwt.AccountClaims, error) {
	id, err := TokenAccountID(t.Credential)
	if err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(id)
	ac.Name = "token-" + t.ID
	ac.Expires = t.Expires.Add(tokenGrace).Unix()
	ac.Limits.Conn = 4
	ac.Limits.LeafNodeConn = 0
	subj := wire.EnrolSubjectPrefix + "." + t.ID
	ac.Imports.Add(&jwt.Import{Type: jwt.Service, Account: k.Operator.ControlPublic, Subject: jwt.Subject(subj)})
	return ac, nil
}

// ResolverConfig is the operator-mode part of a server's configuration:
// the operator (and, while a rotation of its key is announced, the one
// announced beside it: a server trusts the operators its configuration
// names when it starts, and takes no change of them at a reload), the
// system account, the full resolver in store's accounts directory
// (deletion allowed: a revoked or past token's account is deleted), and
// CONTROL and the system account preloaded.
func (k *Keys) ResolverConfig(store string) (string, error) {
	o := k.Operator
	ops, err := o.OperatorJWTs()
	if err != nil {
		return "", err
	}
	quoted := make([]string, len(ops))
	for i, op := range ops {
		quoted[i] = q(op)
	}
	sys, err := o.SystemAccountJWT()
	if err != nil {
		return "", err
	}
	ctl, err := o.ControlAccountJWT()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "operator: [%s]\nsystem_account: %s\n", strings.Join(quoted, ", "), q(o.SystemPublic))
	fmt.Fprintf(&b, "resolver {\n  type: full\n  dir: %s\n  allow_delete: true\n  interval: \"2m\"\n  timeout: \"5s\"\n}\n", q(filepath.Join(store, accountsDir)))
	fmt.Fprintf(&b, "resolver_preload {\n  %s: %s\n  %s: %s\n}\n", o.SystemPublic, q(sys), o.ControlPublic, q(ctl))
	return b.String(), nil
}
