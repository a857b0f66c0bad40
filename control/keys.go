package control

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// The files of the key directory.
const (
	FileControlKey = "control.key" // Ed25519 private key, PKCS#8 PEM (0600)
	FileControlPub = "control.pub" // Ed25519 public key, base64, one line
	FileBrokerCert = "broker.crt"  // the broker's self-signed ECDSA P-256 certificate, PEM
	FileBrokerKey  = "broker.key"  // its private key, PKCS#8 PEM (0600)
	FileNKey       = "control.nk"  // the NKey seed of the control side's broker user (0600)
	// FileNKeyPrevious holds the control NKeys nkey rotate replaced, a
	// seed a line, newest first, kept until serve signs in with the new
	// one (0600).
	FileNKeyPrevious = "control.nk.previous"
	FileSettings     = "control.json" // {"broker_url": "tls://127.0.0.1:4222", "format": 1}
	// FileNodesAccount is the NKey seed of the nodes' account: it signs the
	// user JWT each grant carries (0600). Made by init, or on first use by
	// a key directory made before enrolment existed.
	FileNodesAccount = "nodes-account.nk"
	// FileNodesAccountNext is the nodes' account key announced to replace
	// it (account-key rotate), until the switch renames it over it.
	FileNodesAccountNext = "nodes-account.nk.next"
	// FileRecoveryKey is the offline recovery key (Ed25519, PKCS#8 PEM,
	// 0600), made by init for the operator to move off the machine: it
	// signs a rotation of the control key when that key is stolen (key
	// rotate --recovery-key), and nothing else. FileRecoveryPub, its
	// public half, stays: every grant names it, and nodes pin it.
	FileRecoveryKey = "recovery.key"
	FileRecoveryPub = "recovery.pub"
	// FileBrokerPins is the newest statement of the broker certificates
	// nodes accept (cert rotate): sent beside every declaration.
	FileBrokerPins = "broker-pins.cose"
)

// DefaultBrokerURL is where the embedded broker listens unless told.
const DefaultBrokerURL = "tls://127.0.0.1:4222"

// Keys is the key directory, loaded.
type Keys struct {
	Dir string
	// Control is the control-plane key as loaded; Signer is the one to
	// sign with, which a rotation serve carries out changes (mu).
	Control     ed25519.PrivateKey
	mu          sync.RWMutex
	Fingerprint string // SHA-256 of broker.crt's DER, hex
	NKey        nkeys.KeyPair
	NKeyPublic  string
	BrokerURL   string // from control.json
	// Account signs node users' JWTs; AccountPublic is its public half.
	// Both are as loaded: nodes says which key signs and which are
	// accepted while a rotation is under way.
	Account       nkeys.KeyPair
	AccountPublic string
	nodes         *signingKey
	// Recovery is the recovery key's public half (FileRecoveryPub); nil
	// in a key directory made before it.
	Recovery ed25519.PublicKey
	// Operator is the operator-mode key set of an existing broker
	// (broker-config --resolver); nil when the broker is the embedded one
	// or configured from a file. With it, every connection of the control
	// side signs in with a user JWT, and grants name the node's account.
	Operator *Operator
	// pins is the newest statement of the broker's certificates
	// (FileBrokerPins, a wire.BrokerPins envelope): nil when none;
	// pinsSeq its sequence.
	pins    []byte
	pinsSeq uint64
}

// BrokerFingerprint is the broker certificate's fingerprint now (a
// rotation's switch changes it in serve).
func (k *Keys) BrokerFingerprint() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.Fingerprint
}

// BrokerPins is the newest statement of the broker's certificates, nil
// when none was made.
func (k *Keys) BrokerPins() []byte {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.pins
}

// BrokerPinsSeq is the sequence of BrokerPins (0: none).
func (k *Keys) BrokerPinsSeq() uint64 {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.pinsSeq
}

// pinsUnder is the statement of the broker's certificates env, checked
// under key.
func pinsUnder(key ed25519.PublicKey, env []byte) (*wire.BrokerPins, error) {
	payload, err := wire.Open(key, wire.PurposeBrokerPins, env)
	if err != nil {
		return nil, err
	}
	return wire.ParseBrokerPins(payload)
}

func (k *Keys) setBroker(fingerprint string, pins []byte, seq uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pinsSeq = seq
	if fingerprint != "" {
		k.Fingerprint = fingerprint
	}
	k.pins = pins
}

// Signer is the control-plane key to sign with now.
func (k *Keys) Signer() ed25519.PrivateKey {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.Control
}

// setSigner makes next the key signed with from now on.
func (k *Keys) setSigner(next ed25519.PrivateKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Control = next
}

// ControlPublic is the control-plane public key.
func (k *Keys) ControlPublic() ed25519.PublicKey { return k.Signer().Public().(ed25519.PublicKey) }

// ControlPublicBase64 is the control-plane public key as the configs carry it.
func (k *Keys) ControlPublicBase64() string {
	return base64.StdEncoding.EncodeToString(k.ControlPublic())
}

// KeyID is the control key's id (wire.KeyID).
func (k *Keys) KeyID() string { return wire.KeyID(k.ControlPublic()) }

// CertFile and KeyFile are the broker's certificate and key paths.
func (k *Keys) CertFile() string { return filepath.Join(k.Dir, FileBrokerCert) }

// KeyFile is the broker's private key path.
func (k *Keys) KeyFile() string { return filepath.Join(k.Dir, FileBrokerKey) }

type settings struct {
	BrokerURL string `json:"broker_url"`
	// Format is the key directory's format, settingsFormat as init writes
	// it; a directory made before the field (or without the file) is
	// format 1. Its other files are keys and certificates in their own
	// standard formats (PEM, base64, NKey seeds).
	Format int `json:"format,omitempty"`
}

// settingsFormat is the key directory's format. A later one is refused:
// the directory holds the keys the fleet trusts, and a release that does
// not know what a later one keeps there must not half read it.
const settingsFormat = 1

// heldKeys are the keys whose presence makes a directory a control side's
// key directory, which init never writes over.
var heldKeys = []string{FileControlKey, FileBrokerKey, FileNKey}

// initFiles are the files init makes.
var initFiles = []string{FileControlKey, FileControlPub, FileRecoveryKey, FileRecoveryPub, FileBrokerKey, FileBrokerCert, FileNKey, FileSettings}

// onlyInitsOwn refuses a directory that holds anything init does not
// make: init makes it private (0700) and writes the control side's keys
// into it, which done to a directory of other files would hide them from
// their owners and mix the keys among them. A file system's lost+found
// (a disk of its own) is let be; a control side's key directory (its keys
// in it) is said of after the lock, which names a serve running on it.
func onlyInitsOwn(dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil // missing (made next), or said by what opens it next
	}
	for _, f := range heldKeys {
		if slices.ContainsFunc(des, func(de os.DirEntry) bool { return de.Name() == f }) {
			return nil
		}
	}
	var other []string
	for _, de := range des {
		if n := de.Name(); !slices.Contains(initFiles, n) && n != FileLock && n != "lost+found" {
			other = append(other, de.Name())
		}
	}
	if len(other) > 0 {
		if len(other) > 3 {
			other = append(other[:3], "…")
		}
		return fmt.Errorf("%s holds files init does not make (%s): give init an empty or new directory; nothing was changed", dir, strings.Join(other, ", "))
	}
	return nil
}

// Init makes the key directory: the control-plane signing key, the broker's
// self-signed certificate for 127.0.0.1, ::1, localhost and hosts, and the
// control side's NKey. brokerURL ("" for DefaultBrokerURL) is where client
// commands find the broker. It refuses a directory that already holds keys.
func Init(dir string, hosts []string, brokerURL string) (_ *Keys, err error) {
	if brokerURL == "" {
		brokerURL = DefaultBrokerURL
	}
	if brokerURL, err = brokerURLsOf(brokerURL); err != nil {
		return nil, fmt.Errorf("--url: %w", err)
	}
	if err := onlyInitsOwn(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, statedir.ExplainAccess("create", dir, err, "")
	}
	// Taken before anything in it is looked at: a serve running on it is
	// named, rather than its keys merely found.
	lock, err := lockDir(dir, "init")
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	for _, f := range heldKeys {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return nil, fmt.Errorf("%s already holds keys (%s); not overwriting them", dir, f)
		}
	}
	// Whole or not at all: an init a full disk cut short leaves none of
	// its files, so that run again once there is room it is not refused
	// for the keys it made (no serve has used them: the lock is held).
	made := slices.DeleteFunc(slices.Clone(initFiles), func(f string) bool { _, err := os.Lstat(filepath.Join(dir, f)); return err == nil })
	defer func() {
		if err != nil {
			for _, f := range made {
				os.Remove(filepath.Join(dir, f))
			}
		}
	}()
	// The control-plane key, and the recovery key for the operator to take
	// off this machine.
	if err := newSigningKey(dir, FileControlKey, FileControlPub); err != nil {
		return nil, err
	}
	if err := newSigningKey(dir, FileRecoveryKey, FileRecoveryPub); err != nil {
		return nil, err
	}
	// The broker's certificate.
	certPEM, keyPEM, err := brokerCertificate(hosts)
	if err != nil {
		return nil, err
	}
	if err := writeNew(dir, FileBrokerKey, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(dir, FileBrokerCert, certPEM, 0o644); err != nil {
		return nil, err
	}
	// The control side's broker user.
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := writeNew(dir, FileNKey, append(seed, '\n'), 0o600); err != nil {
		return nil, err
	}
	s, _ := json.MarshalIndent(settings{BrokerURL: brokerURL, Format: settingsFormat}, "", "  ")
	if err := writeNew(dir, FileSettings, append(s, '\n'), 0o600); err != nil {
		return nil, err
	}
	return LoadKeys(dir)
}

// newSigningKey makes an Ed25519 key in dir: its private half in
// keyFile (PKCS#8 PEM, 0600), its public half in pubFile (base64).
func newSigningKey(dir, keyFile, pubFile string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	b, err := privatePEM(priv)
	if err != nil {
		return err
	}
	if err := writeNew(dir, keyFile, b, 0o600); err != nil {
		return err
	}
	return writeNew(dir, pubFile, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644)
}

// privatePEM is key as PKCS#8 PEM (parsePrivate reads it back).
func privatePEM(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writeNew writes a file that must not exist yet, durably: its content
// synced, then its directory's entry. One it could not write whole (a full
// disk) is removed: a key half written would be found at the next run and
// refused, or read as garbage.
func writeNew(dir, name string, data []byte, mode os.FileMode) (err error) {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(p)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return statedir.SyncDir(dir)
}

func brokerCertificate(hosts []string) (certPEM, keyPEM []byte, err error) {
	return selfSigned("nox-mesh broker", hosts, x509.ExtKeyUsageServerAuth)
}

// routeCertificate is the certificate a cluster's servers present to one
// another on their routes, each side checking the other's against it (it
// is its own authority): client and server authentication both, for the
// route addresses. It is apart from the broker's, which nodes pin and
// which need not allow client authentication.
func routeCertificate(hosts []string) (certPEM, keyPEM []byte, err error) {
	return selfSigned("nox-mesh routes", hosts, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

// selfSigned makes a P-256 key and a certificate for it, signed by itself,
// naming loopback and hosts (names or addresses, each possibly a
// comma-separated list).
func selfSigned(cn string, hosts []string, ext ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(20, 0, 0), // pinned, not chained: expiry is not the trust
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           ext,
		BasicConstraintsValid: true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	for _, h := range hosts {
		for _, h := range strings.Split(h, ",") {
			h = strings.TrimSpace(h)
			if h == "" {
				continue
			}
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// LoadKeys reads the key directory.
func LoadKeys(dir string) (*Keys, error) {
	k := &Keys{Dir: dir, BrokerURL: DefaultBrokerURL}
	b, err := readKeyFile(dir, FileControlKey)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("control key: %w (run mesh-control init --dir %s)", err, dir)
	}
	if err != nil {
		return nil, err
	}
	if k.Control, err = parsePrivate(FileControlKey, b); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, FileRecoveryPub)); err == nil {
		r, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(r) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%s: not a base64 Ed25519 public key", FileRecoveryPub)
		}
		k.Recovery = ed25519.PublicKey(r)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, statedir.ExplainAccess("read", filepath.Join(dir, FileRecoveryPub), err, "")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, FileBrokerCert), filepath.Join(dir, FileBrokerKey))
	if err != nil {
		// A directory for an existing broker may hold only its certificate.
		b, err2 := readKeyFile(dir, FileBrokerCert)
		if err2 != nil {
			return nil, fmt.Errorf("broker certificate: %w", err2)
		}
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: not a PEM certificate", FileBrokerCert)
		}
		k.Fingerprint = link.Fingerprint(blk.Bytes)
	} else {
		k.Fingerprint = link.Fingerprint(cert.Certificate[0])
	}
	if b, err := os.ReadFile(filepath.Join(dir, FileBrokerPins)); err == nil {
		k.pins = b
		if bp, err := pinsUnder(k.ControlPublic(), b); err == nil {
			k.pinsSeq = bp.Seq
		}
	}
	seed, err := readKeyFile(dir, FileNKey)
	if err != nil {
		return nil, fmt.Errorf("control NKey: %w", err)
	}
	if k.NKey, err = nkeys.FromSeed([]byte(strings.TrimSpace(string(seed)))); err != nil {
		return nil, fmt.Errorf("%s: %w", FileNKey, err)
	}
	if k.NKeyPublic, err = k.NKey.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(k.NKeyPublic) {
		return nil, fmt.Errorf("%s: not a user NKey seed", FileNKey)
	}
	if k.nodes, err = loadSigningKey(dir, FileNodesAccount, true); err != nil {
		return nil, err
	}
	k.Account = k.nodes.current()
	k.AccountPublic, _ = k.Account.PublicKey()
	if k.Operator, err = loadOperator(dir); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, FileSettings)); err == nil {
		var s settings
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", FileSettings, err)
		}
		if s.Format > settingsFormat {
			return nil, fmt.Errorf("%s: the key directory %s is in format v%d, written by a later mesh-control; this one reads formats up to v%d", FileSettings, dir, s.Format, settingsFormat)
		}
		if s.BrokerURL != "" {
			k.BrokerURL = s.BrokerURL
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return k, nil
}

// parsePrivate reads an Ed25519 private key in PKCS#8 PEM; name says
// whose, in an error.
func parsePrivate(name string, b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: not PEM", name)
	}
	pk, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	k, ok := pk.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an Ed25519 key", name)
	}
	return k, nil
}

// readKeyFile reads name in the key directory. One this process may not
// read is said so, with whose it is and its mode (statedir.ExplainAccess):
// the keys are there, and "run init" would send the operator to make
// others.
func readKeyFile(dir, name string) ([]byte, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, statedir.ExplainAccess("read", p, err, "")
	}
	return b, nil
}
