package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// nobodyToFinish says whether nothing can carry out an enrolment of
// state now: no daemon holds the state, and no executor's socket is at
// sock. A daemon holding it serves the agent that finishes it, on
// whatever socket it was started with (enrol is told the default unless
// --socket says otherwise). An agent not seen among this machine's
// processes is no proof: an app's agent on Android, or a guest's over
// vsock, is not one by that name.
func nobodyToFinish(state, sock string) bool {
	if serving(state) > 0 {
		return false
	}
	_, err := os.Lstat(sock)
	return err != nil
}

// agentDiagnosis says, when an enrolment or a rekey of state has waited
// in vain for the agent, what root can see of why: no executor socket at
// sock (the daemon is not running, or — said as such — it holds the state
// on another socket), no mesh-agent process, or an agent whose user may
// not reach the socket — the most common mistake, an agent started as
// another user than the executor's --agent-user, which the agent itself
// logs as an error but the command would otherwise only guess at.
func agentDiagnosis(state, sock string) string {
	if _, err := os.Lstat(sock); err != nil {
		if pid := serving(state); pid > 0 {
			return fmt.Sprintf("mesh-executor serve (pid %d) holds %s on another socket than %s: --socket naming its socket says what its agent does", pid, state, sock)
		}
		return noSocket(sock)
	}
	all := agentProcs()
	if len(all) == 0 {
		return "no mesh-agent process is running"
	}
	// A machine may run more than one agent (containers, another mesh's,
	// several nodes on one machine): those whose command line names
	// another socket (or vsock) are not this executor's, and are not said
	// of one by one.
	var agents []proc
	var others []string
	for _, a := range all {
		if a.serves(sock) {
			agents = append(agents, a)
		} else {
			others = append(others, fmt.Sprintf("pid %d: %s", a.pid, a.socket))
		}
	}
	if len(agents) == 0 {
		return fmt.Sprintf("no mesh-agent process is started for the socket %s (the running ones name another: %s)", sock, strings.Join(others, "; "))
	}
	var says []string
	for _, a := range agents {
		if why := a.blockedAt(sock); why != "" {
			says = append(says, fmt.Sprintf("the agent (pid %d, uid %d, gid %d) may not connect to the executor's socket %s: %s; start the agent as the executor's --agent-user, or the executor with --agent-user naming the agent's", a.pid, a.uid, a.gid, sock, why))
		} else {
			says = append(says, fmt.Sprintf("mesh-agent (pid %d, uid %d) can reach %s: its log says why the enrolment has not finished", a.pid, a.uid, sock))
		}
	}
	if len(others) > 0 {
		says = append(says, fmt.Sprintf("(%d other mesh-agent processes name another socket)", len(others)))
	}
	return strings.Join(says, "\n")
}

// serves says whether p was started for the executor's socket sock: its
// --socket, or the default when it names none (the agent reads no
// environment: its flags are all it goes by).
func (p proc) serves(sock string) bool {
	if strings.HasPrefix(p.socket, "vsock ") {
		return false
	}
	if p.socket == sock || filepath.Clean(p.socket) == filepath.Clean(sock) {
		return true
	}
	a, err1 := os.Stat(p.socket)
	b, err2 := os.Stat(sock)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// agentSocket is the executor's socket an agent's command line names (a
// relative path read from its working directory), "vsock CID:PORT" for
// one that reaches its executor over vsock, the default for neither.
func agentSocket(pid int, args []string) string {
	socket := wire.SocketPath
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || name != "socket" && name != "vsock" {
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		if name == "vsock" {
			if value != "" {
				return "vsock " + value
			}
			continue
		}
		socket = value
	}
	if !filepath.IsAbs(socket) {
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
			socket = filepath.Join(cwd, socket)
		}
	}
	return socket
}

// noSocket says that there is no executor socket at sock.
func noSocket(sock string) string {
	return fmt.Sprintf("there is no executor socket at %s: mesh-executor serve is not running", sock)
}

// proc is a running process as /proc shows it.
type proc struct {
	pid, uid, gid int
	groups        []int
	// socket is the executor's socket its command line names
	// (agentSocket).
	socket string
}

// agentProcs finds the processes named mesh-agent, with the ids they run
// under now (the agent drops to its user in code).
func agentProcs() []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "mesh-agent" {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if len(args) > 0 {
			args = args[1:]
		}
		p := proc{pid: pid, uid: -1, gid: -1, socket: agentSocket(pid, args)}
		for _, line := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(line, ":")
			f := strings.Fields(v)
			switch {
			case k == "Uid" && len(f) > 1:
				p.uid, _ = strconv.Atoi(f[1]) // effective
			case k == "Gid" && len(f) > 1:
				p.gid, _ = strconv.Atoi(f[1])
			case k == "Groups":
				for _, g := range f {
					if n, err := strconv.Atoi(g); err == nil {
						p.groups = append(p.groups, n)
					}
				}
			}
		}
		if p.uid >= 0 {
			out = append(out, p)
		}
	}
	return out
}

// blockedAt says what keeps p from connecting to sock — a directory on the
// way it may not search, or the socket it may not write — or "".
func (p proc) blockedAt(sock string) string {
	if p.uid == 0 {
		return ""
	}
	var dirs []string
	for d := filepath.Dir(sock); ; d = filepath.Dir(d) {
		dirs = append([]string{d}, dirs...)
		if d == filepath.Dir(d) {
			break
		}
	}
	for _, d := range dirs {
		if why := p.lacks(d, 1, "search"); why != "" {
			return why
		}
	}
	return p.lacks(sock, 2, "write to")
}

// lacks says why p may not do bit (1 search, 2 write) on path, or "".
func (p proc) lacks(path string, bit uint32, what string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st := fi.Sys().(*syscall.Stat_t)
	mode := uint32(fi.Mode().Perm())
	var have uint32
	switch {
	case int(st.Uid) == p.uid:
		have = mode >> 6
	case int(st.Gid) == p.gid || containsInt(p.groups, int(st.Gid)):
		have = mode >> 3
	default:
		have = mode
	}
	if have&bit != 0 {
		return ""
	}
	return fmt.Sprintf("it may not %s %s (uid %d, gid %d, mode %04o)", what, path, st.Uid, st.Gid, mode)
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
