package control_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/control"
	"github.com/nox-mesh/nox-mesh-host/link"
)

// overlay set whose settings are stored but whose publishing the store
// refuses (a full disk; here the declarations' stream held to the bytes
// it has) says the overlay is set, and why it did not go out: it read as a
// change refused, while the overlay was set and serve published it later.
func TestAnOverlaySetButNotPublishedSaysItIsSet(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, dir, "127.0.0.1:0")
	ctx := context.Background()
	enrolNode(t, s, "n1")
	release := holdStream(t, s, link.DeclStream)
	defer release()
	var out strings.Builder
	err := control.OverlaySetOn(s.client, &out, control.OverlayChange{})
	if err == nil || !strings.Contains(err.Error(), "the overlay is set (") || !strings.Contains(err.Error(), "was not published to every node") {
		t.Fatalf("overlay set, its publishing refused: %v\n%s", err, out.String())
	}
	if _, err := s.client.Overlay(ctx); err != nil {
		t.Fatalf("the overlay it said was set: %v", err)
	}
}
