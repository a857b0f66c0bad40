package control

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// DefaultArchiveGrace is how long an archive no declaration names stays in
// the store after it was put: long enough for an operator to put one and
// declare it later in the day, short enough that a store a release a week
// fills does not keep every release for years.
const DefaultArchiveGrace = 24 * time.Hour

// archiveRef is how a declaration names an archive in the store
// (ArchiveURL). Found in the bytes as they are kept — a declaration's
// envelope carries its JSON payload as is, an assignment its module's
// resources — so nothing is decoded to know what is named.
var archiveRef = regexp.MustCompile(`obj://([0-9a-f]{64})`)

// PruneArchives removes from the archive store each archive that no kept
// declaration (the newest link.DeclsPerNode of every node) and no
// assignment names, once it was put more than grace ago. It returns the
// digests removed.
//
// What a node applies names only what its newest declaration names: an
// archive no kept declaration names is in no node's cache's future. An
// archive put and declared in the same moment the prune looks is named by
// then, or put less than grace ago; one put long ago and declared again
// just as the prune removes it is refused at the node, saying the object
// is missing (code archive), and put again by the operator.
func (c *Client) PruneArchives(ctx context.Context, grace time.Duration) ([]string, error) {
	named, err := c.archivesNamed(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := c.Archives.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the archive store: %w", err)
	}
	var removed []string
	for _, info := range infos {
		if info.Deleted || named[info.Name] || time.Since(info.ModTime) < grace {
			continue
		}
		if err := c.Archives.Delete(ctx, info.Name); errors.Is(err, jetstream.ErrObjectNotFound) {
			continue // another serve of the same cluster removed it first
		} else if err != nil {
			return removed, fmt.Errorf("remove archive %s: %w", info.Name, err)
		}
		// The store's delete leaves the object's record, marked deleted,
		// for as long as the store lives: one message an archive ever put.
		// Nothing reads a deleted record (the agent's read of one is an
		// archive not found either way), so it goes too.
		if err := c.purgeArchiveRecord(ctx, info.Name); err != nil {
			return removed, err
		}
		removed = append(removed, info.Name)
	}
	return removed, nil
}

// archivesNamed is the set of archive digests the kept declarations and
// the assignments name.
func (c *Client) archivesNamed(ctx context.Context) (map[string]bool, error) {
	named := map[string]bool{}
	note := func(b []byte) {
		for _, m := range archiveRef.FindAllSubmatch(b, -1) {
			named[string(m[1])] = true
		}
	}
	stream, err := c.JS.Stream(ctx, link.DeclStream)
	if err != nil {
		return nil, fmt.Errorf("read the declarations: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the declarations: %w", err)
	}
	if info.State.Msgs > 0 {
		if err := c.readStream(ctx, link.DeclStream, jetstream.OrderedConsumerConfig{}, func(m jetstream.Msg) bool { note(m.Data()); return true }); err != nil {
			return nil, fmt.Errorf("the declarations: %w", err)
		}
	}
	keys, err := c.KV.ListKeysFiltered(ctx, assignKey("*"))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return named, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the assignments: %w", err)
	}
	for k := range keys.Keys() {
		if e, err := c.KV.Get(ctx, k); err == nil {
			note(e.Value())
		}
	}
	return named, nil
}

// keepArchivesPruned prunes the archive store every quarter of grace (at
// most hourly) until ctx ends.
func (c *Client) keepArchivesPruned(ctx context.Context, grace time.Duration, log *slog.Logger) error {
	every := min(grace/4, time.Hour)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		removed, err := c.PruneArchives(ctx, grace)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(removed) > 0 {
			log.Info("archives no declaration names removed from the store", "count", len(removed), "grace", grace)
		}
	}
}

// purgeArchiveRecord removes the record (meta message) of the archive
// named sum from the archive store's stream.
func (c *Client) purgeArchiveRecord(ctx context.Context, sum string) error {
	st, err := c.JS.Stream(ctx, link.ArchiveStream)
	if err != nil {
		return fmt.Errorf("the archive store: %w", err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(archiveRecordSubject(sum))); err != nil {
		return fmt.Errorf("remove the record of archive %s: %w", sum, err)
	}
	return nil
}

// archiveRecordSubject is where the object store keeps an archive's
// record: the bucket's meta subject, the name base64url-encoded
// (nats.go's object store layout).
func archiveRecordSubject(sum string) string {
	return "$O." + link.ArchiveBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(sum))
}
