package control

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// rekeyTokenTTL is how long the token a rekey answer carries lives: the
// agent turns to it within a heartbeat of the answer; a node that goes
// away before asks again (a new token) when it is back.
const rekeyTokenTTL = time.Hour

// rekeyResend is how often one answer is sent again to the same request.
const rekeyResend = 10 * time.Second

// answerRekey answers a node's request that its keys be renewed (the
// steps: wire.RekeyRequest), carried in its heartbeat: checked against
// the identity key its record holds, then a token for the node, sealed to
// the sealing key its record holds, in an answer this side signs, kept in
// the record and sent on the node's notice subject. The same request
// again (the agent sends it with each heartbeat until the answer comes)
// is sent the same answer; a new one (root asked again) gets a new token,
// and the one before, unused, is revoked.
//
// What it refuses is said in the log and changes nothing: the request is
// the node's word, carried by an agent trusted for nothing. An error is a
// registry write that did not happen; the heartbeat comes again.
//
// broker is where the node says it reaches the broker, which the token
// names (a node reaches the broker at an address of its own, which this
// side cannot know); one that is not tls:// addresses (brokerURLs) is not
// taken, and the token names this side's own.
func (c *Client) answerRekey(ctx context.Context, node, enrolment string, req *wire.RekeyRequest, broker string) error {
	log := c.log.With("node", node, "enrolment", enrolment)
	if req.Node != node || req.Enrolment != enrolment {
		log.Warn("rekey: a request for another node or enrolment; refused", "asked_node", req.Node, "asked_enrolment", req.Enrolment)
		return nil
	}
	rec, rev, err := c.Node(ctx, node)
	if err != nil {
		return nil
	}
	if rec.Enrolment != enrolment || rec.NKey == "" {
		log.Warn("rekey: a request from an enrolment that is not the node's live one; refused")
		return nil
	}
	if rec.Keys == nil {
		log.Warn("rekey: refused: the node's record holds no keys to check the request against (it was added by hand): issue it a token (mesh-control token issue --node " + node + ")")
		return nil
	}
	if err := req.Check(rec.Keys.Identity); err != nil {
		log.Warn("rekey: refused: " + err.Error())
		return nil
	}
	if r := rec.Rekey; r != nil && r.Nonce == req.Nonce {
		// Sent again, at most every rekeyResend: a backlog of heartbeats
		// read after serve's restart is one answer, not one each.
		if last, ok := c.rekeySent.Load(node + "/" + r.Nonce); ok && time.Since(last.(time.Time)) < rekeyResend {
			return nil
		}
		return c.sendRekey(rec, r)
	}
	sealing, err := base64.StdEncoding.DecodeString(rec.Keys.Sealing)
	if err != nil {
		log.Warn("rekey: refused: the node's record holds no sealing key to seal the token to")
		return nil
	}
	if b, err := brokerURLsOf(broker); errors.Is(err, errOverAToken) {
		// The node's own addresses, which its token would carry and its
		// configuration take: this side's in their place could cut it off.
		log.Warn("rekey: refused: the broker addresses the node reaches are more than a token carries; enrol it again naming fewer (mesh-control token issue --node "+node+" --broker-url …)", "err", err.Error())
		return nil
	} else if err != nil {
		if broker != "" {
			log.Info("rekey: the broker address the node said is not one a token takes; its token names this side's own", "said", broker, "err", err.Error())
		}
		broker = ""
	} else {
		broker = b
	}
	text, t, err := c.issueToken(ctx, node, false, rekeyTokenTTL, broker, true)
	if err != nil {
		return fmt.Errorf("rekey of %s: %w", node, err)
	}
	sealed, err := wire.SealRekeyToken(sealing, node, req.Nonce, text)
	if err != nil {
		// Not a key the token can be sealed to: asking again changes
		// nothing, so it is refused, not tried again.
		c.KV.Purge(context.Background(), tokenKey(t.ID))
		log.Warn("rekey: refused: " + err.Error())
		return nil
	}
	payload, _ := json.Marshal(&wire.RekeyAnswer{Node: node, Enrolment: enrolment, Nonce: req.Nonce, Token: sealed, Expires: t.Expires})
	env, err := wire.Seal(c.Keys.Signer(), wire.PurposeRekey, payload)
	if err == nil {
		err = c.keepRekey(ctx, rec, rev, &RekeyRecord{Nonce: req.Nonce, Token: t.ID, Issued: time.Now().UTC(), Answer: env})
	}
	if err != nil {
		// Nothing names the token: withdrawn, so no live token is left
		// behind for an answer never sent.
		c.KV.Purge(context.Background(), tokenKey(t.ID))
		return fmt.Errorf("rekey of %s: %w", node, err)
	}
	log.Info("rekey: the node asked for new keys, proved by its identity key; a token for it sent, sealed to it", "token", t.ID, "expires", t.Expires)
	rec, _, err = c.Node(ctx, node)
	if err != nil || rec.Rekey == nil {
		return nil
	}
	return c.sendRekey(rec, rec.Rekey)
}

// listenOf is the address a broker serves brokerURL on, where no --listen
// says another: its first server's host and port, NATS' 4222 where it
// names none (brokerURLsOf).
func listenOf(brokerURL string) string {
	first, _, _ := strings.Cut(brokerURL, ",")
	first = strings.TrimSpace(first)
	if u, err := url.Parse(first); err == nil && u.Host != "" {
		if u.Port() == "" {
			return net.JoinHostPort(u.Hostname(), "4222")
		}
		return u.Host
	}
	return strings.TrimPrefix(strings.TrimPrefix(first, "tls://"), "nats://")
}

// brokerURLsOf is s, a broker address as an operator or a node's config
// gives it, in the one form every reader of a token takes
// (wire.ParseToken: tls://, no space): tls://HOST[:PORT], or a cluster's
// list of them, comma-separated; or why it is none. It takes what the
// agent and nats.go take — nats:// (a node reaches the broker over TLS
// pinned to its certificate whatever the scheme says), no port (NATS'
// 4222), spaces around the commas — and writes it so. The one rule for
// every address the control side hands a node: init --url, token issue
// and node add --broker-url, a rekey's.
func brokerURLsOf(s string) (string, error) {
	if strings.TrimSpace(s) == "" || len(s) > 2048 {
		return "", fmt.Errorf("broker address %q: empty or over 2048 bytes", s)
	}
	var out []string
	for _, one := range strings.Split(s, ",") {
		one = strings.TrimSpace(one)
		u, err := url.Parse(one)
		if err != nil {
			return "", fmt.Errorf("broker address %q: %w", one, err)
		}
		port, perr := strconv.Atoi(u.Port())
		switch {
		case u.Scheme != "tls" && u.Scheme != "nats":
			return "", fmt.Errorf("broker address %q: not tls://HOST:PORT", one)
		case u.Hostname() == "":
			return "", fmt.Errorf("broker address %q: no host (tls://HOST:PORT)", one)
		case strings.Count(u.Host, ":") > 1 && !strings.HasPrefix(u.Host, "["):
			return "", fmt.Errorf("broker address %q: an IPv6 address goes in brackets (tls://[fd00::1]:4222)", one)
		case (u.Port() != "" || strings.HasSuffix(u.Host, ":")) && (perr != nil || port < 1 || port > 65535):
			return "", fmt.Errorf("broker address %q: a port is 1..65535", one)
		case u.Path != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
			return "", fmt.Errorf("broker address %q: tls://HOST:PORT and nothing else", one)
		}
		out = append(out, "tls://"+u.Host)
	}
	// Every token handed to a node carries them: a list it cannot carry
	// is refused here, where it is given, not when a node is added.
	if all := strings.Join(out, ","); len(all) > wire.MaxBrokerURL {
		return "", fmt.Errorf("broker addresses %q: %d bytes as a token carries them, over the %d it holds: name fewer servers, or shorter names: %w", all, len(all), wire.MaxBrokerURL, errOverAToken)
	}
	return strings.Join(out, ","), nil
}

// errOverAToken: broker addresses a token cannot carry.
var errOverAToken = errors.New("a token could not carry them")

// keepRekey puts r in the node's record (rec, at revision rev, as read),
// and revokes the token of the answer it replaces if that is unused. A
// record changed meanwhile is read again; one whose enrolment changed is
// left alone, and the token withdrawn by the caller.
func (c *Client) keepRekey(ctx context.Context, rec *NodeRecord, rev uint64, r *RekeyRecord) error {
	for attempt := 0; attempt < 100; attempt++ {
		enrolment, before := rec.Enrolment, rec.Rekey
		rec.Rekey = r
		data, _ := json.Marshal(rec)
		_, err := c.KV.Update(ctx, nodeKey(rec.Name), data, rev)
		if err == nil {
			if before != nil && before.Token != r.Token {
				// Unused, it enrols no one now; used, it changed nothing.
				var used *TokenUsedError
				if _, _, err := c.RevokeToken(ctx, before.Token); err != nil && !errors.As(err, &used) {
					c.log.Warn("rekey: the token of an earlier answer was not revoked", "token", before.Token, "err", err)
				}
			}
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("registry: %w", err)
		}
		if rec, rev, err = c.Node(ctx, rec.Name); err != nil {
			return err
		}
		if rec.Enrolment != enrolment {
			return fmt.Errorf("node %s was enrolled again meanwhile", rec.Name)
		}
	}
	return fmt.Errorf("registry: node %s kept changing", rec.Name)
}

// sendRekey sends the answer kept in r on rec's node's notice subject
// (link.RekeyHeader), with what the control side says beside all it sends
// a node (linkHeader): a node that missed a rotation of the control key
// takes it with the answer, which the new key signed. Core NATS: a node
// away hears it with the next copy of its request.
func (c *Client) sendRekey(rec *NodeRecord, r *RekeyRecord) error {
	h := c.linkHeader(rec)
	h.Set(link.RekeyHeader, r.Nonce)
	c.rekeySent.Store(rec.Name+"/"+r.Nonce, time.Now())
	return c.NC.PublishMsg(&nats.Msg{Subject: link.SubjectsOf(rec.Name).Notice, Data: r.Answer, Header: h})
}
