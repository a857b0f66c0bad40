package control

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// CertSubject is where serve rotates the broker's certificate (mesh-control
// cert rotate), in the control side's account.
const CertSubject = "mesh.control.cert"

// CertRequest asks serve to announce a new broker certificate (Switch
// false) or to switch the broker to the one announced.
type CertRequest struct {
	Switch bool `json:"switch,omitempty"`
	// Force switches although some nodes have not taken the
	// announcement: they cannot link afterwards until enrolled again.
	Force bool `json:"force,omitempty"`
}

// CertResult is what a step of the rotation did.
type CertResult struct {
	Phase       string `json:"phase"` // "announced" or "switched"
	Current     string `json:"current"`
	Next        string `json:"next,omitempty"`
	Seq         uint64 `json:"seq"`
	Nodes       int    `json:"nodes"`
	Republished int    `json:"republished"`
	// Held are the nodes whose newest declaration holds sealed content,
	// not signed again; Alone how many of them and of those with none were
	// sent the statement alone (offerStatements), which a node away takes
	// at its first heartbeat back.
	Held  []string `json:"held,omitempty"`
	Alone int      `json:"alone,omitempty"`
	// NotYet are the nodes whose last heartbeat had not taken the
	// announcement (a switch refuses while there are any, unless forced).
	NotYet []string `json:"not_yet,omitempty"`
	// Reload says what the operator still has to do for the broker to
	// present the new certificate (an existing broker without pid files).
	Reload string `json:"reload,omitempty"`
	Error  string `json:"error,omitempty"`
}

// answerCert carries out the broker certificate's rotation asked on
// CertSubject; srv is the embedded broker (nil: an existing one, told by
// SIGHUP through pids when named).
func answerCert(c *Client, srv *Server, pids []string, log *slog.Logger) error {
	return answerServe(c, CertSubject, func() *CertResult { return &CertResult{} }, func(ctx context.Context, req CertRequest) (*CertResult, error) {
		res, err := c.RotateCert(ctx, req, srv, pids)
		if res == nil {
			res = &CertResult{}
		}
		if err != nil {
			log.Error("the broker's certificate was not rotated", "err", err)
		} else {
			log.Warn("the broker's certificate rotation", "phase", res.Phase, "current", res.Current, "next", res.Next, "seq", res.Seq)
		}
		return res, err
	})
}

// RotateCert is one step of the broker certificate's rotation, in serve.
// Announcing makes the new certificate (beside the old: broker.crt.next)
// and a statement, signed by the control key, that nodes accept both,
// sent beside every declaration from then on, each node's newest signed
// again to carry it at once. Switching, once every node has taken that
// (its heartbeat says so), puts the new certificate in the old one's
// place, has the broker present it — linked nodes stay linked — and
// states that nodes accept the new one alone.
func (c *Client) RotateCert(ctx context.Context, req CertRequest, srv *Server, pids []string) (*CertResult, error) {
	rotateMu.Lock()
	defer rotateMu.Unlock()
	k := c.Keys
	nextCert, nextKey := k.CertFile()+".next", k.KeyFile()+".next"
	res := &CertResult{Current: k.BrokerFingerprint()}
	last := k.BrokerPinsSeq()
	if _, err := os.Stat(k.KeyFile()); err != nil {
		return nil, fmt.Errorf("this key directory holds no broker key (%s): the broker is the operator's own, whose certificate is rotated on it", FileBrokerKey)
	}
	if !req.Switch {
		fp, err := certFingerprint(nextCert)
		if errors.Is(err, os.ErrNotExist) {
			var hosts []string
			if hosts, err = certHosts(k.CertFile()); err != nil {
				return nil, err
			}
			var certPEM, keyPEM []byte
			if certPEM, keyPEM, err = brokerCertificate(hosts); err != nil {
				return nil, err
			}
			if err := statedir.WriteBytes(nextKey, keyPEM, 0o600); err != nil {
				return nil, err
			}
			if err := statedir.WriteBytes(nextCert, certPEM, 0o644); err != nil {
				return nil, err
			}
			fp, err = certFingerprint(nextCert)
		}
		if err != nil {
			return nil, err
		}
		res.Phase, res.Next, res.Seq = "announced", fp, last+1
		if err := c.statePins(last+1, []string{res.Current, fp}, ""); err != nil {
			return nil, err
		}
		recs, err := c.records(ctx)
		if err != nil {
			return res, err
		}
		for _, r := range recs {
			if r.IsRevoked() || r.Enrolment == "" {
				continue
			}
			res.Nodes++
			switch signed, held, err := c.republish(ctx, r.Name, k.ControlPublic()); {
			case err != nil:
				return res, fmt.Errorf("%s's newest declaration, signed again: %w", r.Name, err)
			case signed:
				res.Republished++
			default:
				if held {
					res.Held = append(res.Held, r.Name)
				}
				if c.offerStatements(ctx, r.Name, r.Enrolment, nil, stPins) {
					res.Alone++
				}
			}
		}
		return res, nil
	}
	fp, err := certFingerprint(nextCert)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no certificate is announced (no %s in the key directory): cert rotate announces one, then --switch; a switch made leaves none until the next cert rotate", filepath.Base(nextCert))
		}
		return nil, fmt.Errorf("the certificate announced does not read (%s: %v): cert rotate announces one anew", filepath.Base(nextCert), err)
	}
	res.Phase, res.Next, res.Seq = "switched", fp, last+1
	ns, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		if n.State == StateRevoked {
			continue
		}
		res.Nodes++
		if n.Heartbeat == nil || n.Heartbeat.BrokerPinsSeq < last {
			res.NotYet = append(res.NotYet, n.Name)
		}
	}
	if len(res.NotYet) > 0 && !req.Force {
		return res, fmt.Errorf("not switched: %d node(s) have not taken the new certificate yet, and could not link after the switch: %s — wait for them (mesh-control nodes), or switch with --force and enrol them again", len(res.NotYet), strings.Join(res.NotYet, ", "))
	}
	// The key first: a crash between the two leaves the new key beside
	// the old certificate and the new one still announced
	// (broker.crt.next), which serve finishes as it starts
	// (FinishCertSwitch) — never a certificate presented with a key not
	// its own.
	if err := os.Rename(nextKey, k.KeyFile()); err != nil {
		return nil, err
	}
	if err := os.Rename(nextCert, k.CertFile()); err != nil {
		return nil, err
	}
	if err := c.statePins(last+1, []string{fp}, fp); err != nil {
		return nil, err
	}
	switch {
	case srv != nil:
		if err := srv.SwitchCertificate(); err != nil {
			return res, err
		}
	case len(pids) > 0:
		for _, p := range pids {
			if err := signalReload(p); err != nil {
				return res, fmt.Errorf("the broker was not told to reload (%s): %w", p, err)
			}
		}
	default:
		res.Reload = "reload the broker (SIGHUP) so that it presents " + k.CertFile() + "; a cluster's servers each with the new certificate and key"
	}
	res.Current = fp
	return res, nil
}

// statePins signs and keeps the statement that nodes accept pins (seq),
// sent beside every declaration from now on; fingerprint, when set, is
// the broker's certificate now.
func (c *Client) statePins(seq uint64, pins []string, fingerprint string) error {
	payload, _ := json.Marshal(&wire.BrokerPins{Seq: seq, Pins: pins, Issued: time.Now().UTC()})
	env, err := wire.Seal(c.Keys.Signer(), wire.PurposeBrokerPins, payload)
	if err != nil {
		return err
	}
	if err := statedir.WriteBytes(filepath.Join(c.Keys.Dir, FileBrokerPins), env, 0o644); err != nil {
		return err
	}
	c.Keys.setBroker(fingerprint, env, seq)
	return nil
}

// certFingerprint is the fingerprint of the PEM certificate at path.
func certFingerprint(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return "", fmt.Errorf("%s: not a PEM certificate", path)
	}
	return link.Fingerprint(blk.Bytes), nil
}

// certHosts are the names and addresses the certificate at path was made
// for, beyond those every broker certificate names (loopback, localhost).
func certHosts(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: not PEM", path)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, n := range cert.DNSNames {
		if n != "localhost" {
			hosts = append(hosts, n)
		}
	}
	for _, ip := range cert.IPAddresses {
		if !ip.IsLoopback() {
			hosts = append(hosts, ip.String())
		}
	}
	return hosts, nil
}

// FinishCertSwitch finishes a switch of the broker's certificate cut off
// between its two renames: the key in place is broker.crt.next's, so the
// certificate follows it. It says whether there was one to finish.
func FinishCertSwitch(dir string) (bool, error) {
	cert, key := filepath.Join(dir, FileBrokerCert), filepath.Join(dir, FileBrokerKey)
	if _, err := os.Stat(cert + ".next"); err != nil {
		return false, nil
	}
	if _, err := tls.LoadX509KeyPair(cert, key); err == nil {
		return false, nil // the pair in place matches: nothing cut off
	}
	if _, err := tls.LoadX509KeyPair(cert+".next", key); err != nil {
		return false, nil // not this: the key is no announced certificate's either
	}
	if err := os.Rename(cert+".next", cert); err != nil {
		return false, fmt.Errorf("finishing the switch of the broker's certificate: %w", err)
	}
	return true, nil
}
