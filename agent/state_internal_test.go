package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// An agent reads a state file a later release wrote: a launcher's
// rollback runs the release before on the state the newer one left, and a
// field it does not know (last_roster_seq was added so) must not cost it
// what it does know.
func TestAStateFileOfALaterReleaseIsRead(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "agent.json"), []byte(`{"last_stream_seq":41,"last_applied":7,"a_field_of_a_later_release":{"x":1}}`), 0o600)
	st, err := openState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.get(); s.LastStreamSeq != 41 || s.LastApplied != 7 {
		t.Fatalf("read %+v", s)
	}
}
