package control

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/agent"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Bucket is the KV bucket of the node registry.
const Bucket = "mesh_nodes"

// Retention of the streams, per node.
const (
	ReportsPerNode    = 2048
	HeartbeatsPerNode = 16
)

// NodeRecord is a node in the registry (KV key node.<name>).
type NodeRecord struct {
	Name      string    `json:"name"`
	NKey      string    `json:"nkey"` // the public half; the seed went to the node's config only
	Enrolment string    `json:"enrolment"`
	NextSeq   uint64    `json:"next_seq"` // the sequence the next declaration gets
	Created   time.Time `json:"created"`
	// Revoked: the node's identity was revoked (node revoke, or a token
	// issued for it); NKey is then empty and the broker refuses it.
	Revoked time.Time `json:"revoked,omitzero"`
	// Enrolled is when the current enrolment was granted; Token the token
	// that made it; Keys the public keys its executor bound.
	Enrolled time.Time       `json:"enrolled,omitzero"`
	Token    string          `json:"token,omitempty"`
	Keys     *wire.EnrolKeys `json:"keys,omitempty"`
	// EnrolledSeq is the newest sequence declared when the current
	// enrolment was granted (its grant's floor). While NextSeq has not
	// passed it, the newest declaration went to an enrolment before this
	// one, which the node's executor will not act on (the trust rule):
	// it holds nothing the link declared until one is declared to it.
	EnrolledSeq uint64 `json:"enrolled_seq,omitempty"`
	// Capability is the link capability the node's agent last said (at
	// enrolment, then with each profile it reports; 0: a release before
	// it, or a node added by hand that has not said yet). Every
	// declaration to the node is held to the version skew policy by it
	// (link.CheckNode): it is here, in the record each declaration reads
	// to take its sequence, so the check costs no read.
	Capability int `json:"capability,omitempty"`
	// Rotations are the control key's rotations addressed to this
	// enrolment (wire.KeyRotation envelopes, oldest first, at most
	// wire.MaxRotationChain): sent beside every declaration and plan
	// (link.RotationHeader), so that the node, however long it was away,
	// takes them with the first one signed by a key it does not hold yet.
	// An enrolment starts with none: its token pins the key in force.
	Rotations [][]byte `json:"rotations,omitempty"`
	// Rekey is the control side's answer to the node's last rekey
	// request (answerRekey): sent again to each copy of the request, so
	// a lost notice costs a heartbeat, never a second token.
	Rekey *RekeyRecord `json:"rekey,omitempty"`
	// Past are the enrolments this node had before, newest last (at most
	// maxPastEnrolments), each with the NKey its agent signed with: what
	// `reports` verifies their reports by once a revocation, a rekey or an
	// enrolment anew took the key off the record. They let nothing in.
	Past []PastEnrolment `json:"past,omitempty"`
}

// PastEnrolment is an enrolment a node had, and its agent's NKey.
type PastEnrolment struct {
	Enrolment string    `json:"enrolment"`
	NKey      string    `json:"nkey"`
	Until     time.Time `json:"until"`
}

// maxPastEnrolments is how many of a node's past enrolments its record
// keeps: the reports of older ones are passed over as not the node's.
const maxPastEnrolments = 8

// keepPast keeps the live enrolment's NKey among the past ones, before
// a revocation or an enrolment takes it off the record.
func (r *NodeRecord) keepPast(now time.Time) {
	if r.NKey == "" || r.Enrolment == "" {
		return
	}
	for _, p := range r.Past {
		if p.Enrolment == r.Enrolment && p.NKey == r.NKey {
			return
		}
	}
	r.Past = append(r.Past, PastEnrolment{Enrolment: r.Enrolment, NKey: r.NKey, Until: now.UTC()})
	if n := len(r.Past); n > maxPastEnrolments {
		r.Past = r.Past[n-maxPastEnrolments:]
	}
}

// reportKeys is the NKey each of rec's enrolments signed its reports
// with: the live one's, and the past ones'.
func reportKeys(rec *NodeRecord) map[string]string {
	keys := map[string]string{}
	for _, p := range rec.Past {
		keys[p.Enrolment] = p.NKey
	}
	if rec.NKey != "" {
		keys[rec.Enrolment] = rec.NKey
	}
	return keys
}

// RekeyRecord is a rekey request answered: its nonce, the token issued
// for it, and the signed answer (a wire.RekeyAnswer envelope).
type RekeyRecord struct {
	Nonce  string    `json:"nonce"`
	Token  string    `json:"token"`
	Issued time.Time `json:"issued"`
	Answer []byte    `json:"answer"`
}

// ExecutorIdentity is what the executor pins (its identity.json):
//
//	{"node": "…", "enrolment": "…", "control_key": "<base64 ed25519 public>"}
type ExecutorIdentity struct {
	Node       string `json:"node"`
	Enrolment  string `json:"enrolment"`
	ControlKey string `json:"control_key"`
}

// Client is a connection of the control side to the broker: TLS pinned to
// the key directory's broker certificate, authenticated with the control
// NKey. Every command works through one, against the broker, never files.
type Client struct {
	Keys *Keys
	NC   *nats.Conn
	JS   jetstream.JetStream
	KV   jetstream.KeyValue
	// Archives is the object store of archives (link.ArchiveBucket).
	Archives jetstream.ObjectStore
	// decls is the declarations stream, as ensure found it (its cached
	// info says direct get is allowed, so Declare's reads are direct).
	decls jetstream.Stream
	// rosters is the roster stream, as ensure found it.
	rosters jetstream.Stream
	// metrics counts what the recorder records (serve --metrics); nil
	// counts nothing.
	metrics *fleetMetrics
	// DespiteBriefing lets Declare assign to a node whose briefing has a
	// failed line: the way to push the fix.
	DespiteBriefing bool
	// Progress, when set, is told after each node a fan-out (DeclareAll,
	// PublishAll) has done — declared or published, left out or failed —
	// how many are done of how many; one call at a time.
	Progress func(done, of int)
	// Seals are file contents Declare and Plan seal to the node's key
	// ("module.id" → plaintext, see seal.go): each names a file resource
	// of the declaration that leaves content and bytes out.
	Seals map[string][]byte
	// rekeySent is when each rekey answer was last sent (answerRekey),
	// by node and nonce; shared by the copies of a Client made to sign
	// with other settings.
	rekeySent *sync.Map
	// jwtSent is when each node was last sent its renewed broker
	// credential (renewUserJWT).
	jwtSent *sync.Map
	// statementsSent is when a heartbeat of each node, saying what it
	// holds, was last looked at for statements alone (offerStatements).
	statementsSent *lookedAt
	// batched says the declarations' and the registry's streams take
	// atomic batches (ensure): a fan-out writes its sequences and its
	// declarations a batch at a time (DeclareAll).
	batched bool
	// brokerKnows, set when the broker is the embedded one or in operator
	// mode, says whether it lets a node's NKey in yet: a grant is answered
	// once it does, so the node's first connection is not refused.
	brokerKnows func(node, nkey string) bool
	log         *slog.Logger
	// floor is the newest roster sequence this client knows published
	// (rosterFloor), shared by the client's copies.
	floor *floorCache
}

// floorCache is the newest roster sequence known published, and when it
// was last read.
type floorCache struct {
	mu   sync.Mutex
	seq  uint64
	read time.Time
}

// Connect connects to url ("" for the key directory's broker_url) and makes
// sure the streams and the registry bucket exist.
func Connect(ctx context.Context, k *Keys, url string, log *slog.Logger) (*Client, error) {
	return ConnectReplicas(ctx, k, url, 0, log)
}

// ConnectReplicas is Connect, making (or changing) the control side's
// streams, registry and archive store at replicas copies each — on a NATS
// cluster, 3 (mesh-control serve --replicas). 0 keeps what exists at its
// replica count and makes what is missing at 1: a client command never
// changes how the cluster keeps the control side's state. Nothing is kept
// per node on the broker (no consumer, no stream), so the replicated
// assets are these few whatever the fleet's size, as NATS' maintainers
// advise for a cluster.
func ConnectReplicas(ctx context.Context, k *Keys, url string, replicas int, log *slog.Logger) (*Client, error) {
	if url == "" {
		url = k.BrokerURL
	}
	if log == nil {
		log = slog.Default()
	}
	// A broker of the operator's own reloads its users at every change of
	// the registry (serve --broker-pid); a connection made in that moment
	// may be cut, or find JetStream not answering yet. Such failures are
	// tried again for a few seconds; a certificate that is not the pinned
	// one is final at once.
	wait := connectRetry
	if replicas > 1 {
		// serve on a cluster: started with its servers (at boot, by an
		// init), it finds JetStream without a meta leader until the
		// routes are up and one is elected — seconds, or longer.
		wait = clusterConnectRetry
	}
	start := time.Now()
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if replicas == 0 {
			// A command's: serve making a cluster's streams waits on the
			// cluster forming, which its own retry covers.
			actx, cancel = context.WithTimeout(ctx, connectAttemptWithin)
		}
		c, final, err := connectOnce(actx, k, url, replicas, log)
		cancel()
		if err == nil || final || ctx.Err() != nil || !connectAgain(err, time.Since(start), wait) {
			return c, err
		}
		log.Debug("broker: trying again", "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// connectRetry is how long Connect tries again after a failure that may
// pass (see Connect).
const connectRetry = 3 * time.Second

// connectAttemptWithin bounds the requests of one attempt of Connect (the
// streams and buckets looked at, made when missing: a dozen, each answered
// in milliseconds by a broker that answers), so that one left unanswered
// by a server that died does not take the caller's whole deadline.
const connectAttemptWithin = 20 * time.Second

// connectAgain says whether Connect, failed with err after since of
// trying, tries again: within wait for a failure that may pass; and, a
// broker connected to that did not answer a request in time (a cluster's
// stream electing a leader after its server stopped, a stall), within
// unansweredWithin, as a declare's requests are made again
// (untilAnswered). No responder at all is not waited out so long: a
// broker without JetStream answers so at once.
func connectAgain(err error, since, wait time.Duration) bool {
	if since < wait {
		return true
	}
	return since < unansweredWithin && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// clusterConnectRetry is connectRetry for serve on a cluster.
const clusterConnectRetry = 2 * time.Minute

// connectOnce is one attempt of Connect; final says trying again is no use.
func connectOnce(ctx context.Context, k *Keys, url string, replicas int, log *slog.Logger) (*Client, bool, error) {
	nc, final, err := dialBroker(k, url)
	if err != nil {
		return nil, final, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, false, err
	}
	c := &Client{Keys: k, NC: nc, JS: js, log: log, floor: &floorCache{}, rekeySent: &sync.Map{}, jwtSent: &sync.Map{}, statementsSent: &lookedAt{}}
	if err := c.ensure(ctx, replicas); err != nil {
		nc.Close()
		return nil, false, err
	}
	// After ensure, whose failures Connect's own loop tries again.
	c.JS = answeringJS{js}
	return c, false, nil
}

// dialBroker connects to the broker at url as the control side: TLS
// pinned to the key directory's broker certificate, the control NKey. It
// touches no stream; final says trying again is no use (the certificate is
// not the pinned one).
func dialBroker(k *Keys, url string) (nc *nats.Conn, final bool, err error) {
	return dialAs(k, url, "mesh-control", k.signIn())
}

// dialAs is dialBroker signing in as signIn says, the connection named
// name.
func dialAs(k *Keys, url, name string, signIn nats.Option) (nc *nats.Conn, final bool, err error) {
	var pinErr atomic.Pointer[link.PinError]
	opts := []nats.Option{
		nats.Name(name),
		nats.Secure(link.PinnedTLSSet(func() []string { return []string{k.BrokerFingerprint()} }, func(e *link.PinError) { pinErr.Store(e) })),
		signIn,
		// A handshake the broker is slow to answer is waited for, as the
		// agents' is (link.ConnectTimeout).
		nats.Timeout(link.ConnectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
	}
	if k.Operator != nil {
		// A reconnection refused for its credential is tried again, not
		// given up after the second: a rotation's switch cuts the
		// connections of the key switched from, and a serve sharing the
		// key directory signs in again with the key its files name, which
		// a server may refuse for a moment while the accounts listing it
		// reach it. Elsewhere a refused NKey stays refused (nkey rotate is
		// made with serve stopped), and the connection ends.
		opts = append(opts, nats.IgnoreAuthErrorAbort())
	}
	nc, err = nats.Connect(url, opts...)
	if err != nil {
		if pe := pinErr.Load(); pe != nil {
			return nil, true, fmt.Errorf("%v (at %s)", pe, url)
		}
		return nil, false, fmt.Errorf("broker at %s: %w", url, err)
	}
	return nc, false, nil
}

// signIn is how the control side's connections authenticate: the control
// NKey's signature over the broker's nonce — or, when the broker is in
// operator mode, a user of CONTROL (Operator.signIn).
func (k *Keys) signIn() nats.Option {
	if k.Operator == nil {
		return nats.Nkey(k.NKeyPublic, k.NKey.Sign)
	}
	return k.Operator.signIn(k.Operator.ControlPublic, "mesh-control")
}

// Close closes the connection.
func (c *Client) Close() { c.NC.Close() }

// replicasOf is how many copies the stream keeps, 0 when it does not
// exist. Any other failure is an error, never a guess: a client command
// that took a broker's passing silence for "no stream" would make it again
// at one copy, taking a cluster's replicas away.
func (c *Client) replicasOf(ctx context.Context, stream string) (int, error) {
	st, err := c.JS.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return st.CachedInfo().Config.Replicas, nil
}

func (c *Client) ensure(ctx context.Context, replicas int) error {
	// want is the replica count a stream is made or kept at.
	var wantErr error
	want := func(stream string) int {
		if replicas > 0 {
			return replicas
		}
		n, err := c.replicasOf(ctx, stream)
		if err != nil && wantErr == nil {
			wantErr = err
		}
		return max(n, 1)
	}
	streams := []jetstream.StreamConfig{
		{Name: link.DeclStream, Subjects: []string{"mesh.decl.*"}, Retention: jetstream.LimitsPolicy,
			MaxMsgsPerSubject: link.DeclsPerNode, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage,
			MaxMsgSize: MaxPayload, Duplicates: 2 * time.Minute, AllowDirect: true, AllowAtomicPublish: true,
			Description: "signed declarations, one subject per node; nodes read the newest of theirs by direct get"},
		{Name: link.RosterStream, Subjects: []string{link.RosterSubject}, Retention: jetstream.LimitsPolicy,
			MaxMsgsPerSubject: link.RostersKept, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage,
			MaxMsgSize: MaxPayload, AllowDirect: true,
			Description: "the mesh's roster (the overlay's peers), signed; every node reads the newest by direct get"},
		{Name: link.HeartbeatStream, Subjects: []string{"mesh.heartbeat.*"}, Retention: jetstream.LimitsPolicy,
			MaxMsgsPerSubject: HeartbeatsPerNode, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage, AllowDirect: true,
			Description: "heartbeats from nodes; each node reads back its own newest by direct get (the broker's time of it)"},
	}
	for _, p := range link.ReportPlaces() {
		desc := "reports from nodes, a partition of them (link.ReportMapping)"
		if p.Stream == link.ReportStream {
			desc = "reports from nodes through a broker without the partitions' mapping"
		}
		streams = append(streams, jetstream.StreamConfig{Name: p.Stream, Subjects: []string{p.Subjects}, FirstSeq: p.FirstSeq,
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: ReportsPerNode, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage,
			Description: desc})
	}
	for _, sc := range streams {
		if sc.Replicas = want(sc.Name); wantErr != nil {
			return wantErr
		}
		var st jetstream.Stream
		var err error
		if sc.Name == link.HeartbeatStream {
			st, err = c.heartbeatsAsWanted(ctx, sc)
		} else {
			st, err = c.streamAsWanted(ctx, sc)
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
		if sc.Name == link.RosterStream {
			c.rosters = st
		}
		if sc.Name == link.DeclStream {
			c.decls = st
			if err := dropNodeConsumers(ctx, st, c.log); err != nil {
				return err
			}
		}
	}
	kvReplicas, obsReplicas := want("KV_"+Bucket), want(link.ArchiveStream)
	if wantErr != nil {
		return wantErr
	}
	kvc := jetstream.KeyValueConfig{Bucket: Bucket, Description: "the node registry", History: 1, Storage: jetstream.FileStorage, Replicas: kvReplicas}
	kv, err := c.JS.KeyValue(ctx, Bucket)
	var kvInfo *jetstream.StreamInfo
	if err == nil {
		st, serr := kv.Status(ctx)
		if serr != nil || st.History() != int64(kvc.History) || st.Config().Replicas != kvc.Replicas || st.Config().Description != kvc.Description {
			err = errors.New("not as wanted")
		} else if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			kvInfo = bs.StreamInfo()
		}
	}
	if err != nil {
		if _, err = c.JS.CreateOrUpdateKeyValue(ctx, kvc); err != nil {
			return fmt.Errorf("registry bucket %s: %w", Bucket, err)
		}
		kvInfo = nil
	}
	if kv, kvInfo, err = c.registryAsWanted(ctx, kv, kvInfo, kvc.Replicas); err != nil {
		return fmt.Errorf("registry bucket %s: %w", Bucket, err)
	}
	c.KV = registry{kv}
	c.batched = c.decls.CachedInfo().Config.AllowAtomicPublish && kvInfo.Config.AllowAtomicPublish
	osc := jetstream.ObjectStoreConfig{Bucket: link.ArchiveBucket, Description: "archives, each named by its sha256; nodes read them", Storage: jetstream.FileStorage, Replicas: obsReplicas}
	obs, err := c.JS.ObjectStore(ctx, link.ArchiveBucket)
	if err == nil {
		st, serr := obs.Status(ctx)
		if serr != nil || st.Replicas() != osc.Replicas || st.Description() != osc.Description {
			err = errors.New("not as wanted")
		}
	}
	if err != nil {
		if obs, err = c.JS.CreateOrUpdateObjectStore(ctx, osc); err != nil {
			return fmt.Errorf("archive store %s: %w", link.ArchiveBucket, err)
		}
	}
	c.Archives = obs
	return nil
}

// answeringJS is the JetStream context with a stream's information read
// again while the broker does not answer it (answered): every command
// looks at a stream or two, and one meeting its leader's election failed
// with nats.go's bare timeout. Everything else is the context's own.
type answeringJS struct{ jetstream.JetStream }

func (j answeringJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return answeredRead(ctx, func(ctx context.Context) (jetstream.Stream, error) { return j.JetStream.Stream(ctx, name) })
}

// registry is the registry bucket with reads that wait out a moment when
// its stream answers nothing (answered): a broker configured from a file
// reloads its users as nodes are added, and a request in that moment
// finds no responder; a cluster's stream elects a new leader after its
// server stopped. nats.go's own publish retries no responder (twice, 250
// ms apart); a read is as safe to ask again, and an operator's command or
// serve's work reads right after a write that made the reload.
type registry struct{ jetstream.KeyValue }

func (r registry) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return answeredRead(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return r.KeyValue.Get(ctx, key) })
}

// WatchFiltered watches keys as the bucket's own does, on a copy of keys:
// nats.go (v1.55.0, v1.56.0) writes the bucket's prefix into the caller's slice, so
// a listing made again (entries, while the registry did not answer)
// watched "$KV.…" keys, which the bucket refuses as invalid.
func (r registry) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return r.KeyValue.WatchFiltered(ctx, slices.Clone(keys), opts...)
}

// registryAsWanted makes the registry's stream as the control side uses
// it, beyond what a bucket's configuration says, and binds the bucket
// (again, when it changed; kv may be nil). info is the stream's, when
// already read.
//
//   - Direct gets off at more than one copy. Every writer of the registry
//     reads a record and writes it back by its revision, and node add's
//     record is read straight after (its token, the servers' accounts). A
//     direct get may be answered by any replica, and a follower the write
//     has not reached yet answers with no record or the revision before:
//     NATS documents a bucket's direct gets as not reading your own
//     writes, and a get sent to the stream's leader as the one that does.
//     One copy has no follower, so a lone server keeps direct gets.
//   - Atomic batches allowed, where the server knows them (knowsLevel2):
//     a fan-out takes its nodes' sequences a batch at a time (DeclareAll).
func (c *Client) registryAsWanted(ctx context.Context, kv jetstream.KeyValue, info *jetstream.StreamInfo, replicas int) (jetstream.KeyValue, *jetstream.StreamInfo, error) {
	if info == nil {
		st, err := c.JS.Stream(ctx, "KV_"+Bucket)
		if err != nil {
			return nil, nil, err
		}
		info, kv = st.CachedInfo(), nil
	}
	cfg := info.Config
	cfg.AllowDirect = cfg.AllowDirect && replicas <= 1
	cfg.AllowAtomicPublish = cfg.AllowAtomicPublish || knowsLevel2(info)
	if cfg.AllowDirect != info.Config.AllowDirect || cfg.AllowAtomicPublish != info.Config.AllowAtomicPublish {
		st, err := c.JS.UpdateStream(ctx, cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("its stream as wanted (direct gets %v, atomic batches %v): %w", cfg.AllowDirect, cfg.AllowAtomicPublish, err)
		}
		info, kv = st.CachedInfo(), nil
	}
	// Bound again at more than one copy either way: a handle bound
	// before another control side turned direct gets off still makes them.
	if kv == nil || replicas > 1 {
		var err error
		if kv, err = c.JS.KeyValue(ctx, Bucket); err != nil {
			return nil, nil, err
		}
	}
	return kv, info, nil
}

// streamAsWanted returns the stream sc names, made or updated only when it
// is missing or differs from sc in what sc sets. Every command starts by
// ensuring the streams: an update the stream does not need still makes the
// broker rewrite its metadata on disk, so on a full disk no command — not
// even a read — got past this point.
func (c *Client) streamAsWanted(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := c.JS.Stream(ctx, sc.Name)
	if err == nil {
		// Asked only of a server that knows it: an older one would take
		// the update and leave it out, and be asked again at every start.
		sc.AllowAtomicPublish = sc.AllowAtomicPublish && knowsLevel2(st.CachedInfo())
		have := st.CachedInfo().Config
		if slices.Equal(have.Subjects, sc.Subjects) && have.Retention == sc.Retention && have.MaxMsgsPerSubject == sc.MaxMsgsPerSubject &&
			have.Discard == sc.Discard && have.Storage == sc.Storage && (sc.MaxMsgSize == 0 || have.MaxMsgSize == sc.MaxMsgSize) &&
			(sc.Duplicates == 0 || have.Duplicates == sc.Duplicates) && have.AllowDirect == sc.AllowDirect &&
			have.Description == sc.Description && have.Replicas == sc.Replicas && have.PersistMode == sc.PersistMode &&
			have.AllowAtomicPublish == sc.AllowAtomicPublish {
			return st, nil
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	} else {
		sc.AllowAtomicPublish = sc.AllowAtomicPublish && c.serverKnowsLevel2()
	}
	return c.JS.CreateOrUpdateStream(ctx, sc)
}

// MaxArchiveBytes is the largest archive a node takes (wire.MaxArchiveBytes).
const MaxArchiveBytes = wire.MaxArchiveBytes

// archivePutWithin bounds a whole archive put (PutArchive), however slowly
// the broker acknowledges its chunks.
const archivePutWithin = 10 * time.Minute

// ArchiveURL is the URL a declaration names an archive in the store by.
func ArchiveURL(sum string) string { return "obj://" + sum }

// PutArchive stores the archive at path in the archive store under its
// sha256 (hex), unless it is there already, and returns the digest and the
// size. The file is hashed as it is read, and read once.
func (c *Client) PutArchive(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	if !fi.Mode().IsRegular() {
		return "", 0, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > MaxArchiveBytes {
		return "", 0, fmt.Errorf("%s: %d bytes, over the %d a node takes", path, fi.Size(), int64(MaxArchiveBytes))
	}
	// Read once for both: its digest, and every entry as a node's
	// executor would take it (shapes.WalkArchive) — an archive no node
	// unpacks is refused here, before it is stored, not at every node.
	h := sha256.New()
	if err := shapes.WalkArchive(io.TeeReader(f, h), func(shapes.ArchiveEntry, io.Reader) error { return nil }); err != nil {
		return "", 0, fmt.Errorf("%s is not an archive a node unpacks (a tar, gzipped or not, of directories and regular files), and is not stored: %w", path, err)
	}
	if _, err := io.Copy(h, f); err != nil { // what follows the tar's end
		return "", 0, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if info, err := c.Archives.GetInfo(ctx, sum); err == nil && !info.Deleted && int64(info.Size) == fi.Size() {
		return sum, fi.Size(), nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}
	// Hashed again as it goes in: a file changed between the two reads is
	// not stored under a digest it does not have.
	h.Reset()
	// A deadline for the whole put: without one, nats.go gives each
	// chunk's acknowledgement its default 5 s, which a busy machine's
	// broker, syncing each write to disk, can take longer than (a put
	// failed so in make soak beside make test).
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, archivePutWithin)
		defer cancel()
	}
	info, err := c.Archives.Put(ctx, jetstream.ObjectMeta{Name: sum, Description: filepath.Base(path)}, io.TeeReader(io.LimitReader(f, MaxArchiveBytes+1), h))
	if err != nil {
		return "", 0, fmt.Errorf("archive store: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum || int64(info.Size) != fi.Size() {
		c.Archives.Delete(context.Background(), sum)
		return "", 0, fmt.Errorf("%s changed while it was stored; try again", path)
	}
	return sum, fi.Size(), nil
}

func nodeKey(name string) string { return "node." + name }

// Node reads a node record and its revision.
func (c *Client) Node(ctx context.Context, name string) (*NodeRecord, uint64, error) {
	// Said as a name no node can have, not as the registry's "invalid
	// key": every command that names one node reads it here.
	if err := link.ValidNodeName(name); err != nil {
		if strings.Contains(name, ",") {
			err = fmt.Errorf("%w (a list of nodes, n1,n2,…, is taken by declare alone)", err)
		}
		return nil, 0, err
	}
	e, err := c.KV.Get(ctx, nodeKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("no node %q in the registry", name)
	}
	if err != nil {
		return nil, 0, err
	}
	var r NodeRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("node %q: %w", name, err)
	}
	return &r, e.Revision(), nil
}

// AddNode registers a node: a record with a fresh enrolment id and NKey,
// its subject emptied of anything left
// by a node of the same name before. It returns the agent's config (with
// the seed, which the control side does not keep) and what the executor
// pins. brokerURL is the broker as the node reaches it ("" for the
// client's).
func (c *Client) AddNode(ctx context.Context, name, brokerURL string) (*agent.Config, *ExecutorIdentity, error) {
	if err := link.ValidNodeName(name); err != nil {
		return nil, nil, err
	}
	if brokerURL != "" {
		var err error
		if brokerURL, err = brokerURLsOf(brokerURL); err != nil {
			return nil, nil, fmt.Errorf("--broker-url: %w", err)
		}
	}
	if brokerURL == "" {
		brokerURL = c.NC.ConnectedUrl()
		if brokerURL == "" {
			brokerURL = c.Keys.BrokerURL
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, nil, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	var rb [10]byte
	rand.Read(rb[:])
	rec := &NodeRecord{Name: name, NKey: pub, Enrolment: "e-" + hex.EncodeToString(rb[:]), NextSeq: 1, Created: time.Now().UTC()}
	data, _ := json.Marshal(rec)
	if _, err := c.KV.Create(ctx, nodeKey(name), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, fmt.Errorf("node %q is already registered", name)
		}
		return nil, nil, fmt.Errorf("registry: %w", err)
	}
	undo := func(err error) (*agent.Config, *ExecutorIdentity, error) {
		c.KV.Purge(context.Background(), nodeKey(name))
		return nil, nil, err
	}
	if err := c.freshQueue(ctx, name); err != nil {
		return undo(err)
	}
	// The user JWT a grant would carry: a broker in operator mode signs
	// in no one without one; any other takes the NKey.
	userJWT, err := c.UserJWT(name, pub)
	if err != nil {
		return undo(err)
	}
	cfg := &agent.Config{
		BrokerURL:         brokerURL,
		BrokerFingerprint: c.Keys.BrokerFingerprint(),
		ControlKey:        c.Keys.ControlPublicBase64(),
		Node:              name,
		Enrolment:         rec.Enrolment,
		NKeySeed:          string(seed),
		UserJWT:           userJWT,
	}
	return cfg, &ExecutorIdentity{Node: name, Enrolment: rec.Enrolment, ControlKey: c.Keys.ControlPublicBase64()}, nil
}

// UnregisterNew takes node, just registered by AddNode as enrolment,
// out of the registry again: what node add does when it cannot write the
// files that hold the node's seed. A record that moved on since (another
// enrolment) is left alone.
func (c *Client) UnregisterNew(ctx context.Context, name, enrolment string) error {
	e, err := c.KV.Get(ctx, nodeKey(name))
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	var rec NodeRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Enrolment != enrolment {
		return fmt.Errorf("node %s was enrolled again meanwhile; left as it is", name)
	}
	if err := c.KV.Purge(ctx, nodeKey(name), jetstream.LastRevision(e.Revision())); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

// freshQueue empties node's declaration subject: nothing addressed to an
// earlier node of that name, or an earlier enrolment, is read again.
func (c *Client) freshQueue(ctx context.Context, name string) error {
	s := link.SubjectsOf(name)
	if err := c.decls.Purge(ctx, jetstream.WithPurgeSubject(s.Decl)); err != nil {
		return fmt.Errorf("emptying %s: %w", s.Decl, err)
	}
	return nil
}

// dropNodeConsumers deletes the per-node durable consumers ("node-<name>")
// an earlier version made on the declarations stream: nodes read by direct
// get now, and each consumer left is state the broker recovers at every
// start. Only those are touched; the stream's info says whether there are
// any consumers at all, so a control side with none pays nothing.
func dropNodeConsumers(ctx context.Context, st jetstream.Stream, log *slog.Logger) error {
	info := st.CachedInfo()
	if info == nil || info.State.Consumers == 0 {
		return nil
	}
	var names []string
	l := st.ConsumerNames(ctx)
	for n := range l.Name() {
		if strings.HasPrefix(n, "node-") {
			names = append(names, n)
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("listing the consumers of %s: %w", link.DeclStream, err)
	}
	for _, n := range names {
		if err := st.DeleteConsumer(ctx, n); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("deleting the old per-node consumer %s on %s: %w", n, link.DeclStream, err)
		}
	}
	if len(names) > 0 {
		log.Info("deleted the per-node consumers of an earlier version: nodes read their declarations by direct get", "stream", link.DeclStream, "consumers", len(names))
	}
	return nil
}

// Nodes lists the registered node records.
func (c *Client) records(ctx context.Context) ([]*NodeRecord, error) {
	vals, err := c.values(ctx, "node.*")
	if err != nil {
		return nil, err
	}
	out := make([]*NodeRecord, 0, len(vals))
	for k, v := range vals {
		var r NodeRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("registry: %s: %w", k, err)
		}
		out = append(out, &r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// entries reads the registry's current entries under filters in one pass
// (a watch that delivers what is there), keyed by key.
//
// The watch's own end-of-values marker is not taken for the end: it comes
// once the consumer's pending count, as the server gave it at the
// consumer's creation, is reached (or a message says none is pending), and
// that is the one way a listing comes back short with no error — as a
// control side under load did, listing none of its nodes once (the chaos
// run; NATS' issue tracker has the count seen short). A listing read short is no listing:
// the roster composed from one leaves nodes out of every overlay. So the
// keys the stream holds under filters are counted first, and the watch is
// read until it has delivered each of them (deleted keys too: a delete is
// the last message of its key), or the listing fails saying so. A key
// written meanwhile is delivered too, and counts for nothing.
func (c *Client) entries(ctx context.Context, filters ...string) (map[string]jetstream.KeyValueEntry, error) {
	// Read again whole while the registry does not answer: a fresh
	// listing each time, on the caller's deadline (a fleet's listing may
	// take longer than one attempt's).
	return answeredRead(ctx, func(context.Context) (map[string]jetstream.KeyValueEntry, error) { return c.entriesOnce(ctx, filters) })
}

// entriesOnce is one attempt of entries.
func (c *Client) entriesOnce(ctx context.Context, filters []string) (map[string]jetstream.KeyValueEntry, error) {
	want, err := c.registryKeys(ctx, filters)
	if err != nil {
		return nil, fmt.Errorf("registry: counting %s: %w", strings.Join(filters, ", "), err)
	}
	w, err := c.KV.WatchFiltered(ctx, filters)
	if err != nil {
		return nil, fmt.Errorf("registry: reading %s: %w", strings.Join(filters, ", "), err)
	}
	defer w.Stop()
	out, err := readListing(ctx, w.Updates(), want, listingIdle)
	if err != nil {
		return nil, fmt.Errorf("registry: reading %s: %w", strings.Join(filters, ", "), err)
	}
	return out, nil
}

// readListing reads a watch's updates until it has delivered every key of
// want and its end-of-values marker, and returns the keys it holds (a
// deleted key is not held). It waits up to idle past the marker for keys
// not delivered yet, then fails saying how many came.
func readListing(ctx context.Context, updates <-chan jetstream.KeyValueEntry, want map[string]bool, idle time.Duration) (map[string]jetstream.KeyValueEntry, error) {
	out := map[string]jetstream.KeyValueEntry{}
	seen := map[string]bool{}
	marked := false
	var waited <-chan time.Time
	for !marked || len(seen) < len(want) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-waited:
			return nil, fmt.Errorf("the watch delivered %d of the %d keys there", len(seen), len(want))
		case e, ok := <-updates:
			if !ok {
				return nil, errors.New("the watch ended before it delivered everything")
			}
			if e == nil {
				marked = true
				if len(seen) < len(want) {
					waited = time.After(idle)
				}
				continue
			}
			if want[e.Key()] {
				seen[e.Key()] = true
			}
			if e.Operation() == jetstream.KeyValuePut {
				out[e.Key()] = e
			} else {
				delete(out, e.Key())
			}
		}
	}
	return out, nil
}

// listingIdle is how long entries waits, past the watch's end-of-values
// marker, for keys the registry holds and the watch has not delivered.
const listingIdle = 10 * time.Second

// registrySubject is the subject of the registry's stream that holds key:
// what a batch of registry writes publishes on (KeyValue's own).
func registrySubject(key string) string { return "$KV." + Bucket + "." + key }

// registryKeys is the set of keys the registry's stream holds under
// filters, as it says without a consumer (its per-subject state).
func (c *Client) registryKeys(ctx context.Context, filters []string) (map[string]bool, error) {
	str, err := c.JS.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	prefix := registrySubject("")
	for _, f := range filters {
		info, err := str.Info(ctx, jetstream.WithSubjectFilter(prefix+f))
		if err != nil {
			return nil, err
		}
		for subj := range info.State.Subjects {
			keys[strings.TrimPrefix(subj, prefix)] = true
		}
	}
	return keys, nil
}

func (c *Client) values(ctx context.Context, filters ...string) (map[string][]byte, error) {
	es, err := c.entries(ctx, filters...)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(es))
	for k, e := range es {
		out[k] = e.Value()
	}
	return out, nil
}

// Declare signs decl for node and publishes it: node, enrolment and seq are
// set from the registry, seq taken with compare-and-set so two declares never
// share one. A declaration every node would refuse (it does not parse as a
// link declaration, an action say) is refused here, before a sequence is
// taken. With Seals, the named files' content is sealed to the node's key
// for the sequence taken (seal.go). It returns the sequence.
func (c *Client) Declare(ctx context.Context, node string, decl []byte) (uint64, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(decl, &m); err != nil {
		return 0, fmt.Errorf("declaration: %w", err)
	}
	// Registry reads, made again while unanswered (registry.Get); a
	// briefing not read is not taken as none.
	rec, rev, err := c.Node(ctx, node)
	if err != nil {
		return 0, err
	}
	b, err := c.briefing(ctx, node)
	if err != nil {
		return 0, err
	}
	return c.declare(ctx, rec, rev, b, m, nil, false)
}

// fillDecl addresses m to rec with sequence seq and encodes it.
func fillDecl(m map[string]json.RawMessage, rec *NodeRecord, seq uint64) ([]byte, error) {
	m["node"], _ = json.Marshal(rec.Name)
	m["enrolment"], _ = json.Marshal(rec.Enrolment)
	m["seq"], _ = json.Marshal(seq)
	return json.Marshal(m)
}

// probe parses a declaration as its node would receive it with sequence
// seq (fill sets node, enrolment and seq): a declaration every node would
// refuse (an action, an unknown field) is refused before a sequence is
// taken.
func probe(seq uint64, fill func(uint64) ([]byte, error)) error {
	data, err := fill(seq)
	if err != nil {
		return err
	}
	if _, err := linkParse(data); err != nil {
		return fmt.Errorf("refused before signing: %w", err)
	}
	return nil
}

// linkParse parses data as every node takes a declaration from the link,
// and refuses as well what every node's archive step would refuse
// (shapes.Archive.CheckLinkURL, which the parse leaves to the step so that a
// target an earlier release saved still reads): the one check the control
// side makes of resources before it records them (an assignment) or signs
// them (a declaration, a plan request).
func linkParse(data []byte) (*shapes.Declaration, error) {
	d, err := shapes.Parse(data)
	if err != nil {
		return nil, err
	}
	for _, r := range d.Resources {
		if a, ok := r.(*shapes.Archive); ok {
			if err := a.CheckLinkURL(); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// declare is Declare for node record rec (at registry revision rev) whose
// briefing is b, of the declaration m; last, when known, is the newest
// message on the node's subject (nil: read it). DeclareAll reads those for
// many nodes at once; the rules are the same. checked says m was already
// parsed as a link declaration for a node of the registry (DeclareAll
// parses one declaration once, not once per node: only node, enrolment
// and seq differ, and the registry's values of those always parse).
func (c *Client) declare(ctx context.Context, rec *NodeRecord, rev uint64, b *shapes.Briefing, m map[string]json.RawMessage, last *lastOnSubject, checked bool) (uint64, error) {
	node := rec.Name
	if err := c.declarable(ctx, rec, b); err != nil {
		return 0, err
	}
	// Sealed content is checked now, and sealed once the sequence bound
	// into it is taken.
	seals, err := planSeals(rec, m, c.Seals)
	if err != nil {
		return 0, err
	}
	if seals != nil {
		if err := seals.placeholders(m); err != nil {
			return 0, err
		}
	}
	fill := func(seq uint64) ([]byte, error) { return fillDecl(m, rec, seq) }
	if !checked || seals != nil {
		if err := probe(rec.NextSeq, fill); err != nil {
			return 0, err
		}
	}
	carried := last != nil && last.emptyOnly
	rec, seq, reread, err := c.takeSequence(ctx, rec, rev, carried)
	if err != nil {
		return 0, err
	}
	if afterSequence != nil && !carried {
		afterSequence(node)
	}
	if reread && (last == nil || !last.emptyOnly) {
		last = nil // the subject's newest is read again too
	}
	if seals != nil {
		if err := seals.seal(m, rec, seq); err != nil {
			return 0, fmt.Errorf("sealing content for sequence %d of %s (the sequence is spent; declare again): %w", seq, node, err)
		}
	}
	payload, err := fill(seq)
	if err != nil {
		return 0, err
	}
	env, err := wire.Seal(c.Keys.Signer(), wire.PurposeDeclaration, payload)
	if err != nil {
		return 0, err
	}
	if err := c.publishDecl(ctx, rec, seq, env, last); err != nil {
		return 0, err
	}
	return seq, nil
}

// takeSequence takes rec's node's next sequence by a compare-and-set of
// its record on rev, the revision rec was read at. Another declare taking
// it first, the record is read again and the next one taken (reread): it
// returns the record the sequence was taken on. carried takes only the
// first sequence of the node's enrolment (errNotCarried otherwise).
func (c *Client) takeSequence(ctx context.Context, rec *NodeRecord, rev uint64, carried bool) (_ *NodeRecord, seq uint64, reread bool, err error) {
	node := rec.Name
	for attempt := 0; ; attempt++ {
		if carried && rec.NextSeq-1 != rec.EnrolledSeq {
			// A declaration carried to a node enrolled again takes the
			// enrolment's first sequence or none: one taken before it
			// is a person's declare, the newer word, which a carried
			// one published first would pass for superseded.
			return nil, 0, reread, errNotCarried
		}
		seq = rec.NextSeq
		next := *rec
		next.NextSeq++
		data, _ := json.Marshal(&next)
		// Unanswered, the compare-and-set is made again on the same
		// revision: if the first was taken, the second is refused as
		// another's, and the next sequence is taken (one is spent, never
		// published; a node needs each newer, not each one).
		if err = c.untilAnswered(ctx, func(ctx context.Context) error {
			_, err := c.KV.Update(ctx, nodeKey(node), data, rev)
			return err
		}); err == nil {
			return rec, seq, reread, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) || attempt > 1000 {
			return nil, 0, reread, fmt.Errorf("registry: taking a sequence for %s: %w", node, err)
		}
		if rec, rev, err = c.Node(ctx, node); err != nil {
			return nil, 0, reread, err
		}
		reread = true
	}
}

// declarable says why rec's node, with its briefing b (nil: none), is not
// declared to: revoked, of a link capability this control side does not
// serve, or with a failed briefing line.
func (c *Client) declarable(ctx context.Context, rec *NodeRecord, b *shapes.Briefing) error {
	if rec.IsRevoked() {
		return c.revokedError(ctx, rec)
	}
	if err := link.CheckNode(rec.Name, rec.Capability); err != nil {
		return fmt.Errorf("refused by the control side: %w", err)
	}
	// A node whose adoption briefing has a failed line is a node, but is
	// assigned nothing until the failure is resolved.
	if b != nil && b.Outcome == shapes.MarkFailed && !c.DespiteBriefing {
		why := ""
		for _, f := range b.Findings {
			if f.Mark == shapes.MarkFailed {
				why = fmt.Sprintf("%s.%s: %s", f.Module, f.ID, f.Detail)
				break
			}
		}
		return fmt.Errorf("node %s has a failed briefing line (%s); it is assigned nothing until that is resolved (declare with --despite-briefing to push the fix)", rec.Name, why)
	}
	return nil
}

// linkHeader is what the control side says beside all it publishes for
// rec's node to act on (a declaration, its notice, a plan request): its
// link capability, the control key's rotations the node may not have
// taken yet, and the broker certificates nodes accept (cert rotate).
func (c *Client) linkHeader(rec *NodeRecord) nats.Header {
	h := nats.Header{link.CapabilityHeader: []string{link.CapabilityValue}}
	if len(rec.Rotations) > 0 {
		h.Set(link.RotationHeader, wire.EncodeRotationChain(rec.Rotations))
	}
	if p := c.Keys.BrokerPins(); p != nil {
		h.Set(link.PinsHeader, base64.StdEncoding.EncodeToString(p))
	}
	return h
}

// publishDecl puts env, the declaration of sequence seq, on rec's subject
// so that the newest message there is always the newest declaration — the
// agent reads only that one — and tells the node (link.Subjects.Notice).
// Two declares to one node can take their sequences in one order and
// publish in the other: each publishes only on top of the message it read
// as the last (the broker checks, ExpectLastSequencePerSubject), and one
// that finds a newer declaration there already publishes nothing (the node
// reports it superseded with the others it never read).
func (c *Client) publishDecl(ctx context.Context, rec *NodeRecord, seq uint64, env []byte, known *lastOnSubject) error {
	s := link.SubjectsOf(rec.Name)
	msgID := declMsgID(rec, seq)
	emptyOnly := known != nil && known.emptyOnly
	for attempt := 0; ; attempt++ {
		on := known
		known = nil // known once: after a refused publish, read again
		if on == nil {
			on = &lastOnSubject{}
			var m *jetstream.RawStreamMsg
			err := c.untilAnswered(ctx, func(ctx context.Context) (err error) {
				m, err = c.decls.GetLastMsgForSubject(ctx, s.Decl)
				return err
			})
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
			case err != nil:
				return fmt.Errorf("publishing sequence %d for %s: reading the last on %s: %w", seq, rec.Name, s.Decl, err)
			default:
				on.stream = m.Sequence
				on.seq, _ = strconv.ParseUint(m.Header.Get(link.SeqHeader), 10, 64)
				on.id = m.Header.Get(nats.MsgIdHdr)
			}
		}
		if on.stream != 0 && on.id == msgID {
			// This declaration, published by an attempt whose answer
			// was lost (the broker refuses the attempt made again as
			// not on top of the last, which is now its own).
			c.notice(rec, s, env, on.stream)
			return nil
		}
		if on.stream != 0 && on.seq >= seq {
			c.log.Info("a newer declaration is on the node's subject already: this one is superseded before it was published",
				"node", rec.Name, "seq", seq, "newer", on.seq)
			return nil
		}
		last := on.stream
		msg := c.declMsg(rec, seq, env)
		// Made again with the same Msg-Id when unanswered: stored once.
		var ack *jetstream.PubAck
		err := c.untilAnswered(ctx, func(ctx context.Context) (err error) {
			ack, err = c.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectLastSequencePerSubject(last))
			return err
		})
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) && attempt < 100 {
			if emptyOnly {
				c.log.Info("a declaration was published to the node before this one, carried, could be: not carried", "node", rec.Name, "seq", seq)
				return errNotCarried
			}
			continue // another declare published meanwhile: look again
		}
		if err != nil {
			return fmt.Errorf("publishing sequence %d for %s: %w", seq, rec.Name, err)
		}
		c.notice(rec, s, env, ack.Sequence)
		return nil
	}
}

// errNotCarried: a carried declaration found the node declared to since
// it looked (publishDecl with emptyOnly).
var errNotCarried = errors.New("declared to meanwhile: not carried")

// afterSequence, when set (by a test), runs between a declare's taking of
// its sequence and its publish: where a carried declaration may land.
var afterSequence func(node string)

// declMsg is the message of env, rec's declaration of sequence seq, on
// the node's subject (without its Msg-Id and expected last sequence).
func (c *Client) declMsg(rec *NodeRecord, seq uint64, env []byte) *nats.Msg {
	msg := &nats.Msg{Subject: link.SubjectsOf(rec.Name).Decl, Data: env, Header: c.linkHeader(rec)}
	msg.Header.Set(link.SeqHeader, strconv.FormatUint(seq, 10))
	return msg
}

// declMsgID is the Msg-Id of rec's declaration of sequence seq: the
// broker stores a declaration once however often it is published.
func declMsgID(rec *NodeRecord, seq uint64) string {
	return fmt.Sprintf("%s.%s.%d", rec.Name, rec.Enrolment, seq)
}

// notice tells rec's node of env, its declaration stored at stream
// sequence at. The notice carries the declaration, so a linked node needs
// no read; it is a hint all the same: lost, the node reads at its next
// connect or timer.
func (c *Client) notice(rec *NodeRecord, s link.Subjects, env []byte, at uint64) {
	notice := &nats.Msg{Subject: s.Notice, Data: env, Header: c.linkHeader(rec)}
	notice.Header.Set(link.HeaderSequence, strconv.FormatUint(at, 10))
	c.NC.PublishMsg(notice)
}

// unansweredWithin is how long a request the broker does not answer is
// made again — a declare's, a command's connection's, a registry read, a
// stream read that delivered nothing yet: a cluster's stream electing a
// leader after its server stopped (a few seconds past nats.go's 5 s for a
// request), a control machine's stall. A fan-out's nodes are declared to,
// and an operator's command ends as it would have, rather than timed out.
const unansweredWithin = 45 * time.Second

// unansweredEach is how long one attempt waits for its answer before it is
// made again: a request sent to a server that has died is never answered,
// whatever the caller's deadline.
const unansweredEach = 10 * time.Second

// answered runs try, a request safe to make again (a compare-and-set on a
// revision, a read, a publish with its Msg-Id on top of the last), again
// while the broker does not answer it (brokerDistress) within
// unansweredEach, for up to unansweredWithin; stop, when set, says of an
// unanswered attempt that waiting is no use.
func answered(ctx context.Context, try func(context.Context) error, stop func() bool) error {
	each := func() error {
		ctx, cancel := context.WithTimeout(ctx, unansweredEach)
		defer cancel()
		return try(ctx)
	}
	return retryRegistry(ctx, unansweredWithin, each, nil, func(err error) bool {
		return !brokerDistress(err) || (stop != nil && stop())
	})
}

// answeredRead is answered for a read that returns what it read.
func answeredRead[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	var out T
	err := answered(ctx, func(ctx context.Context) (err error) {
		out, err = read(ctx)
		return err
	}, nil)
	return out, err
}

// untilAnswered is answered for a request that writes: it stops at once
// when serve says the store cannot write (a full disk), which no waiting
// mends; the command says why (explainStoreError).
func (c *Client) untilAnswered(ctx context.Context, try func(context.Context) error) error {
	return answered(ctx, try, func() bool {
		_, problem := askStore(ctx, c.NC)
		return problem != ""
	})
}
