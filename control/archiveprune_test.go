package control_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// The archive store keeps what a kept declaration or an assignment names,
// and what was put within the grace; the rest goes. Without it the store
// kept every archive ever put, for as long as the control side lived (the
// soak's first finding).
func TestArchivesNoDeclarationNamesArePruned(t *testing.T) {
	s := serve(t, t.TempDir(), "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(name string) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), name+".tar")
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(name))})
		tw.Write([]byte(name))
		tw.Close()
		os.WriteFile(p, b.Bytes(), 0o600)
		sum, _, err := s.client.PutArchive(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	declared, assigned, named := put("declared"), put("assigned"), put("nothing")
	archive := func(module, sum string) string {
		return fmt.Sprintf(`{"version":1,"resources":[{"module":%q,"id":"d","type":"directory","path":"/srv/%s"},`+
			`{"module":%q,"id":"a","type":"archive","url":%q,"sha256":%q,"destination":"/srv/%s"}]}`, module, module, module, control.ArchiveURL(sum), sum, module)
	}
	addNode(t, s, "d1")
	if _, err := s.client.Declare(ctx, "d1", []byte(archive("decl", declared))); err != nil {
		t.Fatal(err)
	}
	// Assigned to a node whose overlay is not applied yet: held, in no
	// declaration, and kept all the same.
	if _, err := s.client.SetOverlay(ctx, control.OverlayChange{}); err != nil {
		t.Fatal(err)
	}
	enrolNode(t, s, "n1")
	if p, err := s.client.Assign(ctx, "n1", []byte(archive("asg", assigned)), "m.json"); err != nil || p.Held == "" {
		t.Fatalf("assign: %+v %v (want it held)", p, err)
	}
	if removed, err := s.client.PruneArchives(ctx, time.Hour); err != nil || len(removed) != 0 {
		t.Fatalf("within the grace: removed %v (%v), want none", removed, err)
	}
	removed, err := s.client.PruneArchives(ctx, 0)
	if err != nil || !slices.Equal(removed, []string{named}) {
		t.Fatalf("past the grace: removed %v (%v), want only the archive nothing names, %s", removed, err, named)
	}
	for _, sum := range []string{declared, assigned} {
		if info, err := s.client.Archives.GetInfo(ctx, sum); err != nil || info.Deleted {
			t.Fatalf("%s, named, is gone: %v", sum, err)
		}
	}
	if info, err := s.client.Archives.GetInfo(ctx, named); err == nil && !info.Deleted {
		t.Fatalf("%s, named by nothing, is still in the store", named)
	}
	// Nothing of it is left: not its chunks, nor its record marked
	// deleted (one message an archive ever put, for as long as the store
	// lived).
	str, err := s.client.JS.Stream(ctx, link.ArchiveStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := str.Info(ctx, jetstream.WithSubjectFilter("$O."+link.ArchiveBucket+".>"))
	if err != nil {
		t.Fatal(err)
	}
	if recs := si.State.Subjects["$O."+link.ArchiveBucket+".M."+base64.URLEncoding.EncodeToString([]byte(named))]; recs != 0 {
		t.Fatalf("the removed archive's record is still in the stream (%d message)", recs)
	}
	if si.State.Msgs != 4 { // the two kept archives: a record and a chunk each
		t.Fatalf("the archive stream holds %d messages, want the 4 of the two kept archives: %v", si.State.Msgs, si.State.Subjects)
	}
	if removed, err := s.client.PruneArchives(ctx, 0); err != nil || len(removed) != 0 {
		t.Fatalf("again: removed %v (%v), want none", removed, err)
	}
}

// archive put stores only what a node's executor unpacks: a file that is
// not a tar, or a tar holding a link, is refused with the entry named, and
// nothing is stored.
func TestArchivePutRefusesWhatNoNodeUnpacks(t *testing.T) {
	_, _, _, cmd := servedCLI(t)
	dir := t.TempDir()
	notTar := filepath.Join(dir, "notes.txt")
	os.WriteFile(notTar, []byte("hi\n"), 0o600)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "site", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "site/passwd", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	tw.Close()
	link := filepath.Join(dir, "link.tar")
	os.WriteFile(link, b.Bytes(), 0o600)
	for f, say := range map[string]string{notTar: "archive: unexpected EOF", link: `entry "site/passwd" is a symbolic link`} {
		out, errs, code := cmd("archive", "put", f)
		if code != 1 || out != "" || !strings.Contains(errs, f+" is not an archive a node unpacks") || !strings.Contains(errs, say) {
			t.Errorf("archive put %s: exit %d\n%s%s", f, code, out, errs)
		}
	}
}
