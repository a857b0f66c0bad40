package serve

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// Every link state a release wrote is read, a golden a shape, named by
// the commit whose code first wrote it (golden.Releases). A later format is
// read too, as far as this release knows it (TestLinkStateIsReadByEitherRelease):
// the file drives nothing, and a rollback must not lose it.
func TestEveryLinkStateFormatThatShippedIsRead(t *testing.T) {
	since, said := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC), time.Date(2026, 12, 2, 7, 5, 0, 0, time.UTC)
	goldens := map[string]LinkState{
		"a61a636": {Since: since, SaidAt: said},
		"2e0a4c6": {Since: since, SaidAt: said, Revoked: since.Add(time.Minute)},
		"9d97354": {Since: since, SaidAt: said, LastError: "dial tcp 10.0.0.1:4222: connection refused", ClockSkewMS: -1500, ClockAt: since.Add(-10 * time.Minute)},
		"5d5c15c": {Since: since, SaidAt: said, LastError: "dial tcp 10.0.0.1:4222: connection refused", ClockSkewMS: -1500, ClockAt: since.Add(-10 * time.Minute), Format: 1},
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want LinkState) {
		l, err := ReadLinkState(filepath.Join(golden.Dir, release))
		if err != nil || l == nil {
			t.Fatalf("%v", err)
		}
		if l.Up != want.Up || !l.Since.Equal(want.Since) || !l.SaidAt.Equal(want.SaidAt) || !l.Revoked.Equal(want.Revoked) ||
			l.LastError != want.LastError || l.ClockSkewMS != want.ClockSkewMS || !l.ClockAt.Equal(want.ClockAt) || l.Format != want.Format {
			t.Errorf("read %+v; want %+v", l, want)
		}
	})
}
