package launcher

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The halt notice is readable by the agent's group whatever the launcher
// was told of the agent's user: the socket's directory the executor's
// daemon made carries that group, and a launcher run with --agent-user ""
// (a package made the user) wrote the notice root's alone, which the
// agent could not read — a halted executor then looked like one gone.
func TestTheNoticeIsReadableByTheSocketDirectorysGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the launcher's tests run as root, like the launcher")
	}
	const agentGroup = 65534 // nogroup: any group but root's
	for _, tc := range []struct {
		name      string
		dirGroup  int    // -1: no directory yet
		agentUser string // the launcher's --agent-user
		want      int
	}{
		{"the directory's group, no agent user named", agentGroup, "", agentGroup},
		{"the directory's group over the named user's", agentGroup, "root", agentGroup},
		{"no directory yet, no agent user named", -1, "", 0},
		{"a root directory, the named user's group", 0, "nobody", agentGroup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			if tc.dirGroup >= 0 {
				if err := os.Mkdir(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(dir, 0, tc.dirGroup); err != nil {
					t.Fatal(err)
				}
			}
			l := &launcher{cfg: Config{Notice: filepath.Join(dir, "launcher.json"), AgentUser: tc.agentUser}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			l.notice("halted: the machine is the problem")
			fi, err := os.Stat(l.cfg.Notice)
			if err != nil {
				t.Fatal(err)
			}
			if got := int(fi.Sys().(*syscall.Stat_t).Gid); got != tc.want || fi.Mode().Perm() != 0o640 {
				t.Fatalf("the notice is of group %d, mode %v; want group %d, 0640", got, fi.Mode().Perm(), tc.want)
			}
			if n, err := ReadNotice(l.cfg.Notice); err != nil || n == nil || !n.Halted {
				t.Fatalf("%+v %v", n, err)
			}
		})
	}
}
