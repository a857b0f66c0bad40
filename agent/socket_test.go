package agent_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/agent"
)

// An agent that may not connect to the executor's socket says so at once,
// as an error naming the socket, whose the file or directory in the way
// is, its own uid, and what to do — not at debug level while it waits, as
// a hosted agent, for an enrolment that cannot come.
func TestSocketPermissionIsAnError(t *testing.T) {
	bin, uid, gid, nobody, base := agentAsNobody(t)
	listen := func(dir string, dirMode, sockMode os.FileMode) string {
		os.Mkdir(dir, dirMode)
		os.Chmod(dir, dirMode)
		p := filepath.Join(dir, "executor.sock")
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		os.Chmod(p, sockMode)
		return p
	}
	closedDir := listen(filepath.Join(base, "closed"), 0o700, 0o666)
	closedSock := listen(filepath.Join(base, "open"), 0o755, 0o600)
	for _, c := range []struct {
		name, socket, blocker string
	}{
		{"the socket's directory root's 0700", closedDir, fmt.Sprintf("(%s is root's, mode 0700;", filepath.Dir(closedDir))},
		{"the socket root's 0600", closedSock, "(it is root's, mode 0600;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := filepath.Join(base, "state-"+filepath.Base(filepath.Dir(c.socket)))
			os.Mkdir(state, 0o700)
			os.Chown(state, uid, gid)
			lines, exited, _ := runBinary(t, bin, nobody, func(l string) bool { return strings.Contains(l, "level=ERROR") },
				"--user", "nobody", "--state", state, "--config", filepath.Join(base, "none.json"), "--socket", c.socket, "--enrol-poll", "100ms")
			last := ""
			if len(lines) > 0 {
				last = lines[len(lines)-1]
			}
			for _, want := range []string{"level=ERROR", "cannot connect to " + c.socket + ": permission denied " + c.blocker,
				fmt.Sprintf("this agent runs as uid %d gid %d", uid, gid), "--agent-user", "socket=" + c.socket, fmt.Sprintf("uid=%d", uid)} {
				if exited || !strings.Contains(last, want) {
					t.Fatalf("no error line saying %q (exited %v):\n%s", want, exited, strings.Join(lines, "\n"))
				}
			}
		})
	}
}

// --socket naming the socket's directory (or any file that is no socket)
// is said as such, not as a permission the agent's user lacks.
func TestASocketThatIsNoSocketIsSaidSo(t *testing.T) {
	bin, uid, gid, nobody, base := agentAsNobody(t)
	dir := filepath.Join(base, "run")
	os.Mkdir(dir, 0o750)
	state := filepath.Join(base, "state")
	os.Mkdir(state, 0o700)
	os.Chown(state, uid, gid)
	lines, exited, _ := runBinary(t, bin, nobody, func(l string) bool { return strings.Contains(l, "level=ERROR") },
		"--user", "nobody", "--state", state, "--config", filepath.Join(base, "none.json"), "--socket", dir, "--enrol-poll", "100ms")
	last := ""
	if len(lines) > 0 {
		last = lines[len(lines)-1]
	}
	if exited || !strings.Contains(last, dir+" is a directory, not the executor's socket") || strings.Contains(last, "permission denied") {
		t.Fatalf("no error line saying the socket is a directory (exited %v):\n%s", exited, strings.Join(lines, "\n"))
	}
}

// agentAsNobody is the agent's binary, to run as nobody (its uid, gid and
// credential), and a directory nobody may reach.
func agentAsNobody(t *testing.T) (bin string, uid, gid int, nobody *syscall.Credential, base string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the agent is started as another user")
	}
	bin = buildAgent(t)
	uid, gid, err := agent.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	return bin, uid, gid, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, openDir(t)
}
