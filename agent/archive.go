package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nox-mesh/nox-mesh-host/clock"
	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/wire"
)

// Archives over the link. A declaration names an archive in the control
// side's object store by obj://<name> and pins it by sha256. Before the
// agent forwards such a declaration, it reads each object from the store
// (direct gets: the only request of the store a node may make), hashes it
// as it reads, and streams it to the executor's private cache over the
// socket. The executor hashes again as it writes and keeps the bytes only
// under their own digest; the agent's check is for saying upward what went
// wrong, not for the executor's safety.

// archiveRefusal is an archive the declaration names that cannot be had
// as pinned: not in the store, too large, or not the bytes the declaration
// pins — or that the executor's cache cannot hold with what the
// declarations applied there name (by "executor"). The declaration is
// refused and reported so, by the side that said it; asking again would
// get the same answer.
type archiveRefusal struct{ msg, by string }

func (e *archiveRefusal) Error() string { return e.msg }

// refuse makes r the report of a declaration, or a plan, refused for the
// archive: one way for both, as the executor's plan and apply share theirs.
func (e *archiveRefusal) refuse(r *link.Report) *link.Report {
	r.Outcome, r.Refused, r.Code, r.RefusedBy = shapes.Refused, e.msg, CodeArchive, cmp.Or(e.by, "agent")
	return r
}

// CodeArchive is the report code of a declaration refused for an archive.
const CodeArchive = "archive"

// CodeSkew is the report code of a declaration refused because the
// control side that published it is outside the version skew policy
// (link.CheckControl).
const CodeSkew = "skew"

// archiveRequestTimeout bounds one read of the store.
const archiveRequestTimeout = 10 * time.Second

// linkArchives are the obj:// archives of a checked declaration, one per
// digest (it was opened and parsed once, by check: an envelope is verified
// once by the agent, not once per use).
func linkArchives(d *shapes.Declaration) []*shapes.Archive {
	seen := map[string]bool{}
	var out []*shapes.Archive
	for _, r := range d.Resources {
		if ar, ok := r.(*shapes.Archive); ok && strings.HasPrefix(ar.URL, "obj://") && !seen[ar.SHA256] {
			seen[ar.SHA256] = true
			out = append(out, ar)
		}
	}
	return out
}

// streamArchives streams every obj:// archive of d (checked: check) to the
// executor. An
// *archiveRefusal is final for this declaration; any other error is the
// link's or the executor's, and passes.
func (a *Agent) streamArchives(ctx context.Context, d *shapes.Declaration) error {
	for _, ar := range linkArchives(d) {
		name := strings.TrimPrefix(ar.URL, "obj://")
		start := clock.Now()
		n, err := a.streamArchive(ctx, name, ar.SHA256)
		if err != nil {
			return err
		}
		a.log.Info("archive streamed to the executor", "url", ar.URL, "sha256", ar.SHA256, "bytes", n, "took", clock.Since(start).Round(time.Millisecond))
	}
	return nil
}

// objectInfo is what the store keeps about an object (its meta message).
type objectInfo struct {
	Name    string `json:"name"`
	NUID    string `json:"nuid"`
	Size    uint64 `json:"size"`
	Chunks  uint32 `json:"chunks"`
	Deleted bool   `json:"deleted,omitempty"`
}

type directGet struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

var errNotFound = errors.New("not found")

// get is one direct get of the archive store: the message's data and its
// stream sequence.
func (a *Agent) get(ctx context.Context, req directGet) ([]byte, uint64, error) {
	body, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, archiveRequestTimeout)
	defer cancel()
	m, err := a.nc.RequestWithContext(rctx, a.id.Subjects.ArchiveGet, body)
	if err != nil {
		return nil, 0, fmt.Errorf("the archive store: %w", err)
	}
	if st := m.Header.Get("Status"); st != "" {
		if st == "404" {
			return nil, 0, errNotFound
		}
		return nil, 0, fmt.Errorf("the archive store answered %s %s", st, m.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(m.Header.Get(nats.JSSequence), 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("the archive store answered without a sequence")
	}
	return m.Data, seq, nil
}

// archiveInfo is what the store records of object name: an
// *archiveRefusal when a node cannot take it (not there, deleted, too
// large, a record that does not read).
func (a *Agent) archiveInfo(ctx context.Context, name string) (objectInfo, error) {
	url := "obj://" + name
	meta, _, err := a.get(ctx, directGet{LastFor: "$O." + link.ArchiveBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))})
	if errors.Is(err, errNotFound) {
		return objectInfo{}, &archiveRefusal{msg: fmt.Sprintf("archive %s is not in the archive store %s (mesh-control archive put, then send it again)", url, link.ArchiveBucket)}
	}
	if err != nil {
		return objectInfo{}, err
	}
	var info objectInfo
	if err := json.Unmarshal(meta, &info); err != nil || info.NUID == "" || strings.ContainsAny(info.NUID, ".*> ") {
		return objectInfo{}, &archiveRefusal{msg: fmt.Sprintf("archive %s: the store's record of it does not read (%v)", url, err)}
	}
	if info.Deleted {
		return objectInfo{}, &archiveRefusal{msg: fmt.Sprintf("archive %s was deleted from the archive store %s", url, link.ArchiveBucket)}
	}
	if info.Size > wire.MaxArchiveBytes {
		return objectInfo{}, &archiveRefusal{msg: fmt.Sprintf("archive %s holds %d bytes, over the %d a node takes", url, info.Size, uint64(wire.MaxArchiveBytes))}
	}
	return info, nil
}

// checkArchives looks up, for a plan, every obj:// archive of d in the
// store as streamArchives would before an apply, and streams none: a plan
// is refused for an archive as its declaration would be where the store
// says so (not there, deleted, too large). Its bytes are read, and their
// digest checked, only before an apply; the executor plans an archive not
// in its cache as one it would unpack once streamed.
func (a *Agent) checkArchives(ctx context.Context, d *shapes.Declaration) error {
	for _, ar := range linkArchives(d) {
		if _, err := a.archiveInfo(ctx, strings.TrimPrefix(ar.URL, "obj://")); err != nil {
			return err
		}
	}
	return nil
}

// streamArchive reads object name from the store and streams it to the
// executor under the digest the declaration pins, checking it as it reads.
func (a *Agent) streamArchive(ctx context.Context, name, sum string) (uint64, error) {
	url := "obj://" + name
	info, err := a.archiveInfo(ctx, name)
	if err != nil {
		return 0, err
	}
	chunks := "$O." + link.ArchiveBucket + ".C." + info.NUID
	h := sha256.New()
	var read uint64
	ack, err := a.exec.archive(ctx, sum, func(send func([]byte) error) error {
		var seq uint64
		buf := make([]byte, 0, wire.MaxArchiveChunk)
		for i := uint32(0); i < info.Chunks; i++ {
			data, s, err := a.get(ctx, directGet{Seq: seq, NextFor: chunks})
			if errors.Is(err, errNotFound) {
				return &archiveRefusal{msg: fmt.Sprintf("archive %s: chunk %d of %d is missing from the store", url, i+1, info.Chunks)}
			}
			if err != nil {
				return err
			}
			seq = s + 1
			if read += uint64(len(data)); read > info.Size {
				return &archiveRefusal{msg: fmt.Sprintf("archive %s: the store holds more than the %d bytes it records", url, info.Size)}
			}
			h.Write(data)
			for len(data) > 0 {
				n := min(len(data), cap(buf)-len(buf))
				buf, data = append(buf, data[:n]...), data[n:]
				if len(buf) == cap(buf) {
					if err := send(buf); err != nil {
						return err
					}
					buf = buf[:0]
				}
			}
		}
		if got := hex.EncodeToString(h.Sum(nil)); read != info.Size || got != sum {
			return &archiveRefusal{msg: fmt.Sprintf("archive %s: the store's %d bytes have sha256 %s; the declaration pins %s; refused, nothing reached the executor's cache", url, read, got, sum)}
		}
		if len(buf) > 0 {
			return send(buf)
		}
		return nil
	})
	if we := (*wire.Error)(nil); errors.As(err, &we) && we.Code == wire.CodeTooLarge {
		// The executor's word on the archive: its cache cannot hold it
		// with the archives the declarations applied there name, and no
		// apply drops them meanwhile. Streamed again at every back-off,
		// it would be read from the store again each time and said to no
		// one; refused, the control side hears why.
		return read, &archiveRefusal{msg: we.Error(), by: "executor"}
	}
	if err != nil {
		return read, err
	}
	if !ack.Stored {
		// The executor hashed what it was sent and it was not the pinned
		// digest, after the agent's own check passed: the socket or the
		// executor's disk, not the archive. Try again later.
		return read, fmt.Errorf("the executor did not keep archive %s: %s", url, ack.Reason)
	}
	return read, nil
}
