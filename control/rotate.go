package control

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/statedir"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// KeysSubject is where serve carries out a rotation of the control key
// (mesh-control key rotate), in the control side's account: serve holds
// the key it signs with, so the rotation is its own, and no declaration it
// signs falls between the old key and the new.
const KeysSubject = "mesh.control.keys"

// keysQueue: of several serves on one broker, one carries out a rotation.
// The others sign with the key they loaded until they are started again.
const keysQueue = "mesh-control-keys"

// rotationKey is the registry's record of the control key's rotations.
const rotationKey = "keys.rotation"

// rotationRecord is rotationKey: the last rotation's sequence, and the
// key in force after it.
type rotationRecord struct {
	Seq uint64    `json:"seq"`
	Key string    `json:"key"` // key id
	By  string    `json:"by"`
	At  time.Time `json:"at"`
}

// RotateRequest asks serve for a rotation; RecoveryKeyFile, when set,
// names the recovery key's file (on this machine, as serve reads it):
// the rotation is then signed by it, not by the key it retires.
type RotateRequest struct {
	RecoveryKeyFile string `json:"recovery_key_file,omitempty"`
}

// RotateResult is what a rotation did.
type RotateResult struct {
	From string `json:"from"` // key ids
	To   string `json:"to"`
	By   string `json:"by"`
	Seq  uint64 `json:"seq"`
	// Nodes is how many enrolled nodes were addressed a statement;
	// Republished how many had their newest declaration signed again by
	// the new key (a new sequence), which carries the rotation to them.
	Nodes       int `json:"nodes"`
	Republished int `json:"republished"`
	// Alone is how many, with no declaration to sign again, were sent
	// the rotation alone (offerStatements); one linked later takes it at
	// its first heartbeat.
	Alone int `json:"alone,omitempty"`
	// Held are nodes whose newest declaration is not signed again — it
	// holds sealed content, bound to its sequence, or a key before the one
	// retired signed it: each takes the rotation with its next
	// declaration, or, a recovery's, alone at once (offerStatements) and
	// again at its heartbeats until it holds it.
	Held []string `json:"held,omitempty"`
	// LeftBehind are nodes of a release before rotations (link
	// capability 0): they cannot take one, and refuse what the new key
	// signs until they are upgraded and enrolled again.
	LeftBehind []string `json:"left_behind,omitempty"`
	Error      string   `json:"error,omitempty"`
}

// rotateMu: one rotation at a time in this serve.
var rotateMu sync.Mutex

// answerKeys carries out rotations asked on KeysSubject until nc drains.
func answerKeys(c *Client, log *slog.Logger) error {
	return answerServe(c, KeysSubject, func() *RotateResult { return &RotateResult{} }, func(ctx context.Context, req RotateRequest) (*RotateResult, error) {
		res, err := c.RotateKey(ctx, req)
		if res == nil {
			res = &RotateResult{}
		}
		if err != nil {
			log.Error("the control key was not rotated", "err", err)
		} else {
			log.Warn("the control key rotated", "from", res.From, "to", res.To, "by", res.By, "seq", res.Seq, "nodes", res.Nodes, "republished", res.Republished)
		}
		return res, err
	})
}

// served is a result serve answers a command with: its error said in it.
type served interface{ setError(string) }

func (r *RotateResult) setError(e string) { r.Error = e }
func (r *CertResult) setError(e string)   { r.Error = e }

// answerServe answers each request on subject (one serve of several, by
// keysQueue) with what do makes of it (never nil), decoded and encoded as
// JSON, the error in the result (fresh: a request that does not decode);
// each in its own goroutine, for up to 10 minutes.
func answerServe[Q any, R served](c *Client, subject string, fresh func() R, do func(context.Context, Q) (R, error)) error {
	_, err := c.NC.QueueSubscribe(subject, keysQueue, func(m *nats.Msg) {
		go func() {
			var req Q
			res := fresh()
			if err := json.Unmarshal(m.Data, &req); err != nil {
				res.setError("the request does not decode: " + err.Error())
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				r, err := do(ctx, req)
				cancel()
				res = r
				if err != nil {
					res.setError(err.Error())
				}
			}
			b, _ := json.Marshal(res)
			m.Respond(b)
			if a, ok := any(res).(interface{ afterAnswer() }); ok {
				// The answer out before what may cut the asker off.
				c.NC.Flush()
				a.afterAnswer()
			}
		}()
	})
	if err != nil {
		return fmt.Errorf("answering on %s: %w", subject, err)
	}
	return nil
}

// serveAwayWithin is how long askServe asks again while no serve is
// subscribed. A serve reconnecting after the broker restarted (as a key
// rotation asks of it) is away for its reconnect wait plus the client's
// TLS jitter (up to 1.5 s), longer on a busy machine; a command made right
// after the restart must not take that for no serve at all.
const serveAwayWithin = 10 * time.Second

// askServe asks serve on subject with req, and decodes its answer into
// res; what serve found wrong is res's, not the error's. No serve
// subscribed is asked again for serveAwayWithin, by the registry's retry
// rule (retryRegistry).
func askServe(ctx context.Context, cl *Client, subject string, req, res any) error {
	data, _ := json.Marshal(req)
	var m *nats.Msg
	err := retryRegistry(ctx, serveAwayWithin, func() (err error) {
		// A rotation at scale signs for every node: minutes.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		m, err = cl.NC.RequestWithContext(rctx, subject, data)
		return err
	}, nil, func(err error) bool { return !errors.Is(err, nats.ErrNoResponders) })
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("no serve answers on the broker (asked for %s): the rotation is serve's to carry out (it holds the keys it signs with); start mesh-control serve", serveAwayWithin)
	}
	if err != nil {
		return fmt.Errorf("asking serve for the rotation: %w", err)
	}
	if err := json.Unmarshal(m.Data, res); err != nil {
		return fmt.Errorf("serve's answer does not decode: %w", err)
	}
	return nil
}

// RotateKey rotates the control key, in serve: a new key; for every
// enrolled node a statement addressed to its enrolment, signed by the key
// retired (or the recovery key) and by the new one, kept in its record and
// sent beside everything published to it from now on; the new key
// written in place of the old and signed with from then on; the roster,
// and each node's newest declaration, signed again by it, so that each
// node takes the rotation at its next message or link.
func (c *Client) RotateKey(ctx context.Context, req RotateRequest) (*RotateResult, error) {
	rotateMu.Lock()
	defer rotateMu.Unlock()
	k := c.Keys
	old := k.Signer()
	oldPub := old.Public().(ed25519.PublicKey)
	authority, by := old, wire.ByKey
	if req.RecoveryKeyFile != "" {
		b, err := os.ReadFile(req.RecoveryKeyFile)
		if err != nil {
			return nil, statedir.ExplainAccess("read", req.RecoveryKeyFile, err, "")
		}
		rk, err := parsePrivate(req.RecoveryKeyFile, b)
		if err != nil {
			return nil, err
		}
		if k.Recovery == nil {
			return nil, fmt.Errorf("this key directory has no recovery key (%s): its nodes pinned none", FileRecoveryPub)
		}
		if !k.Recovery.Equal(rk.Public()) {
			return nil, fmt.Errorf("%s is not this control side's recovery key (%s is key %s, the file's is %s)", req.RecoveryKeyFile, FileRecoveryPub, wire.KeyID(k.Recovery), wire.KeyID(rk.Public().(ed25519.PublicKey)))
		}
		authority, by = rk, wire.ByRecovery
	}
	recs, err := c.records(ctx)
	if err != nil {
		return nil, err
	}
	res := &RotateResult{From: wire.KeyID(oldPub), By: by}
	var addressed []*NodeRecord
	var before, unsaid []string // of a release before rotations; added by hand, their release not said yet
	for _, r := range recs {
		if r.IsRevoked() || r.Enrolment == "" {
			continue
		}
		if r.Capability < 1 {
			res.LeftBehind = append(res.LeftBehind, r.Name)
			if r.Enrolled.IsZero() {
				unsaid = append(unsaid, r.Name)
			} else {
				before = append(before, r.Name)
			}
			continue
		}
		addressed = append(addressed, r)
	}
	if len(res.LeftBehind) > 0 && by == wire.ByKey {
		var who []string
		if len(before) > 0 {
			who = append(who, fmt.Sprintf("of a release before rotations (link capability 0): %v — upgrade them first (docs/operations.md, Version skew)", before))
		}
		if len(unsaid) > 0 {
			who = append(who, fmt.Sprintf("added by hand, their release not said (never linked, or an agent before rotations): %v — link them with an agent of this release", unsaid))
		}
		return res, fmt.Errorf("nodes that may not take a rotation would refuse all the new key signs; %s; or revoke them", strings.Join(who, "; "))
	}
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	nextPub := next.Public().(ed25519.PublicKey)
	res.To = wire.KeyID(nextPub)
	// The sequence, taken first: a rotation cut off after it leaves a
	// gap, never a sequence used twice.
	var rr rotationRecord
	for attempt := 0; ; attempt++ {
		e, err := c.KV.Get(ctx, rotationKey)
		var rev uint64
		rr = rotationRecord{}
		if err == nil {
			json.Unmarshal(e.Value(), &rr)
			rev = e.Revision()
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("registry: %w", err)
		}
		rr = rotationRecord{Seq: rr.Seq + 1, Key: rr.Key, By: by, At: time.Now().UTC()}
		data, _ := json.Marshal(&rr)
		if rev == 0 {
			_, err = c.KV.Create(ctx, rotationKey, data)
		} else {
			_, err = c.KV.Update(ctx, rotationKey, data, rev)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) || attempt > 100 {
			return nil, fmt.Errorf("registry: the rotation's sequence: %w", err)
		}
	}
	res.Seq = rr.Seq
	// The new key on disk before any statement names it: no node can
	// take a key this side could lose.
	if err := writeKeyFile(k.Dir, FileControlKey+".next", next); err != nil {
		return nil, err
	}
	recovery := ""
	if k.Recovery != nil {
		recovery = base64.StdEncoding.EncodeToString(k.Recovery)
	}
	for _, r := range addressed {
		env, err := wire.SealRotation(authority, next, wire.KeyRotation{Node: r.Name, Enrolment: r.Enrolment, Seq: rr.Seq, By: by,
			From: wire.KeyID(oldPub), Recovery: recovery, Issued: time.Now().UTC()})
		if err != nil {
			return nil, err
		}
		if err := c.addRotation(ctx, r.Name, r.Enrolment, env, by == wire.ByRecovery); err != nil {
			return nil, err
		}
		res.Nodes++
	}
	// The switch: the new key in place of the old (the retired key's
	// file is gone with it: nothing is signed by it again), made durable
	// by control.pub's write, which syncs the directory; then signed with.
	if err := os.Rename(filepath.Join(k.Dir, FileControlKey+".next"), filepath.Join(k.Dir, FileControlKey)); err != nil {
		return nil, err
	}
	if err := statedir.WriteBytes(filepath.Join(k.Dir, FileControlPub), []byte(base64.StdEncoding.EncodeToString(nextPub)+"\n"), 0o644); err != nil {
		return nil, err
	}
	k.setSigner(next)
	// The broker certificates' statement, if one was made, signed again
	// by the new key under its sequence: a node that took the rotation
	// checks statements under the new key, and this side reads the
	// statement's sequence back under the key in force when it starts.
	if p := k.BrokerPins(); p != nil {
		if bp, err := pinsUnder(oldPub, p); err == nil {
			if err := c.statePins(bp.Seq, bp.Pins, ""); err != nil {
				return res, fmt.Errorf("the control key rotated to %s and is signed with; but the broker certificates' statement was not signed again: %w", res.To, err)
			}
		}
	}
	rr.Key = res.To
	data, _ := json.Marshal(&rr)
	if _, err := c.KV.Put(ctx, rotationKey, data); err != nil {
		return res, fmt.Errorf("the control key rotated to %s and is signed with; but the registry's record of the rotation was not written: %w (the next rotation numbers itself from the last it finds)", res.To, err)
	}
	// Everything the nodes read signed again by the new key.
	if _, err := c.Overlay(ctx); err == nil {
		if _, err := c.PublishRoster(ctx); err != nil {
			return res, fmt.Errorf("the control key rotated to %s and is signed with; but the roster was not signed again: %w (mesh-control publish, once the broker takes writes, carries it)", res.To, err)
		}
	}
	for _, r := range addressed {
		switch signed, held, err := c.republish(ctx, r.Name, oldPub); {
		case err != nil:
			return res, fmt.Errorf("the control key rotated to %s and is signed with; but %s's newest declaration was not signed again: %w (it takes the rotation with its next declaration; mesh-control publish sends one)", res.To, r.Name, err)
		case signed:
			res.Republished++
		case held:
			res.Held = append(res.Held, r.Name)
			if by == wire.ByRecovery {
				c.offerStatements(ctx, r.Name, r.Enrolment, nil, stRotations)
			}
		case c.offerStatements(ctx, r.Name, r.Enrolment, nil, stRotations):
			res.Alone++
		}
	}
	return res, nil
}

// addRotation adds env to node's record (of enrolment), keeping the last
// wire.MaxRotationChain; a recovery's statement replaces them all, since
// it is taken whatever key the node holds. A chain holds one statement
// retiring each key: one that retires the key env retires is of a
// rotation cut off before its switch (serve stopped, or killed, between
// the statements and the new key's taking over), whose key never signed
// anything — taken by a node, it would leave the node on that key, past
// env's reach.
func (c *Client) addRotation(ctx context.Context, node, enrolment string, env []byte, alone bool) error {
	added, err := wire.PeekRotation(env)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 100; attempt++ {
		rec, rev, err := c.Node(ctx, node)
		if err != nil || rec.Enrolment != enrolment {
			return nil // gone, or enrolled again: its token pins the new key
		}
		if alone {
			rec.Rotations = [][]byte{env}
		} else {
			rec.Rotations = slices.DeleteFunc(rec.Rotations, func(e []byte) bool {
				r, err := wire.PeekRotation(e)
				return err != nil || (r.By == wire.ByKey && r.From == added.From)
			})
			rec.Rotations = append(rec.Rotations, env)
			if n := len(rec.Rotations); n > wire.MaxRotationChain {
				rec.Rotations = slices.Clone(rec.Rotations[n-wire.MaxRotationChain:])
			}
		}
		data, _ := json.Marshal(rec)
		if _, err = c.KV.Update(ctx, nodeKey(node), data, rev); err == nil {
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("registry: %s's rotation: %w", node, err)
		}
	}
	return fmt.Errorf("registry: %s's record kept changing", node)
}

// republish declares node's newest declaration again, signed by the key
// in force, under a new sequence (signed) — unless there is none, it is
// signed by the key in force already, or it is held: it holds sealed
// content, which is bound to its sequence and which this side cannot read
// back, or a key before retired signed it, which this side cannot check.
func (c *Client) republish(ctx context.Context, node string, retired ed25519.PublicKey) (signed, held bool, err error) {
	m, err := c.decls.GetLastMsgForSubject(ctx, link.SubjectsOf(node).Decl)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	payload, err := wire.Open(retired, wire.PurposeDeclaration, m.Data)
	if err != nil {
		if _, err := wire.Open(c.Keys.ControlPublic(), wire.PurposeDeclaration, m.Data); err == nil {
			return false, false, nil // signed since, by the key in force
		}
		// Signed by a key before the one retired (the node held through
		// an earlier rotation), or by none this side knows: nothing it can
		// check, so nothing it signs again.
		return false, true, nil
	}
	var d map[string]json.RawMessage
	if err := json.Unmarshal(payload, &d); err != nil {
		return false, false, err
	}
	var resources []map[string]json.RawMessage
	json.Unmarshal(d["resources"], &resources)
	for _, r := range resources {
		if _, sealed := r["sealed"]; sealed {
			return false, true, nil
		}
	}
	delete(d, "node")
	delete(d, "enrolment")
	delete(d, "seq")
	body, _ := json.Marshal(d)
	signer := *c
	signer.DespiteBriefing, signer.Seals = true, nil
	if _, err := signer.Declare(ctx, node, body); err != nil {
		return false, false, err
	}
	return true, false, nil
}

// statementsResend is how often a node's heartbeat that says it has not
// taken a statement is looked at (and the statements sent alone again):
// the message is core NATS, lost to a node away, and a later heartbeat
// asks for it again.
const statementsResend = 10 * time.Second

// The statements offerStatements may send a node alone.
type statements int

const (
	stRotations statements = 1 << iota // the control key's (RotationHeader)
	stPins                             // the broker certificates' (PinsHeader)
)

// holds is what a node's heartbeat says it holds of the statements: the
// control key its executor holds in force ("": not said) and the broker
// certificates' statement its agent took last.
type holds struct {
	key  string
	pins uint64
}

// offerStatements sends node, on its notice subject, the statements of
// what (link.StatementsHeader) that nothing else carries to it, so that it
// takes them within a heartbeat rather than at a declaration that may be
// long in coming:
//
//   - the control key's rotations when its declaration subject holds no
//     declaration (never declared to, or emptied by a re-enrolment) — one
//     there takes them with it, signed again by the new key, or held on
//     sealed content (RotateResult.Held) — or when they are a recovery's:
//     the key was stolen, and a node held on it would take the thief's
//     declarations until its next one; it refuses a declaration the
//     stolen key signed that it has not applied yet, the thief's as likely
//     as not. A node that holds a key no kept statement rotates away from
//     is sent none (it is to be enrolled again).
//   - the broker certificates' statement whatever its subject holds: it
//     invalidates nothing, and a node without it cannot link after the
//     certificate's switch — with the rotations beside it when the node
//     holds a retired key, which could not check it.
//
// h is what the node's heartbeat says it holds; nil, at a rotation, when
// that is not known: each statement of what is then taken for not held. A
// heartbeat's ask is looked at once a node, what it holds and what is in
// force every statementsResend: a heartbeat is the agent's to send, the agent is
// trusted for nothing, and a node left behind for long would otherwise
// cost reads at each heartbeat. It returns whether it sent anything; what
// it could not read it sends nothing for, and the node's next heartbeat
// asks again.
func (c *Client) offerStatements(ctx context.Context, node, enrolment string, h *holds, what statements) bool {
	pinsSeq, inForce := c.Keys.BrokerPinsSeq(), c.Keys.KeyID()
	if h != nil {
		if h.key == "" || h.key == inForce {
			what &^= stRotations
		}
		if pinsSeq == 0 || h.pins >= pinsSeq {
			what &^= stPins
		}
		if what == 0 {
			return false
		}
		if !c.statementsSent.due(fmt.Sprintf("%s/%s/%d/%s/%d", node, h.key, h.pins, inForce, pinsSeq), statementsResend) {
			return false
		}
	}
	if pinsSeq == 0 {
		what &^= stPins
	}
	rec, _, err := c.Node(ctx, node)
	if err != nil || rec.IsRevoked() || rec.Enrolment != enrolment || rec.Capability < 1 {
		return false
	}
	pins := what&stPins != 0
	rotations := false
	if what&stRotations != 0 && len(rec.Rotations) > 0 && (h == nil || rotationFrom(rec.Rotations, h.key)) {
		// Beside the pins statement, which the key in force signed, the
		// rotations go whatever the subject holds: a node on a retired
		// key could not take it, nor link after the switch.
		rotations = recovering(rec.Rotations) || pins
		if !rotations {
			_, err := c.decls.GetLastMsgForSubject(ctx, link.SubjectsOf(node).Decl)
			rotations = errors.Is(err, jetstream.ErrMsgNotFound)
		}
	}
	if !pins && !rotations {
		return false
	}
	// What the control side says beside all it sends a node, less what
	// is not to be sent alone now.
	hdr := c.linkHeader(rec)
	hdr.Set(link.StatementsHeader, "1")
	if !pins {
		hdr.Del(link.PinsHeader)
	}
	if !rotations {
		hdr.Del(link.RotationHeader)
	}
	if err := c.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf(node).Notice, Header: hdr}); err != nil {
		return false
	}
	c.log.Debug("sent statements alone: nothing else carries them to the node", "node", node, "rotations", hdr.Get(link.RotationHeader) != "", "pins", hdr.Get(link.PinsHeader) != "")
	return true
}

// lookedAt is when each of a set of keys was last looked at, for a look
// made at most once an interval whoever asks; what is older than the
// interval is forgotten now and then, so the set holds what was looked at
// lately, not every node, holding and key there ever were.
type lookedAt struct {
	m     sync.Map // key → time.Time
	looks atomic.Uint64
}

// due says whether key's look is due (none within every), and counts it
// looked at now if so.
func (l *lookedAt) due(key string, every time.Duration) bool {
	now := time.Now()
	if last, ok := l.m.Load(key); ok && now.Sub(last.(time.Time)) < every {
		return false
	}
	l.m.Store(key, now)
	if l.looks.Add(1)%1024 == 0 {
		l.m.Range(func(k, v any) bool {
			if now.Sub(v.(time.Time)) >= every {
				l.m.Delete(k)
			}
			return true
		})
	}
	return true
}

// recovering says whether the newest rotation of chain (oldest first) is
// a recovery's.
func recovering(chain [][]byte) bool {
	if len(chain) == 0 {
		return false
	}
	r, err := wire.PeekRotation(chain[len(chain)-1])
	return err == nil && r.By == wire.ByRecovery
}

// writeKeyFile writes an Ed25519 private key as PKCS#8 PEM, 0600, durably
// (statedir.WriteBytes).
func writeKeyFile(dir, name string, key ed25519.PrivateKey) error {
	b, err := privatePEM(key)
	if err != nil {
		return err
	}
	return statedir.WriteBytes(filepath.Join(dir, name), b, 0o600)
}
