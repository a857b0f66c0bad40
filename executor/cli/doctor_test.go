package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/executor/enrol"
	"github.com/nox-mesh/nox-mesh-host/executor/identity"
	"github.com/nox-mesh/nox-mesh-host/executor/serve"
	"github.com/nox-mesh/nox-mesh-host/executor/store"
	"github.com/nox-mesh/nox-mesh-host/tests/jsonform"
)

// serveEnv, set, makes the test binary mesh-executor with the arguments
// after "--" (`serve …`): a real daemon, in a process of its own.
const serveEnv = "MESH_EXECUTOR_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		os.Exit(Main("test", args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startDaemon runs `mesh-executor serve` on state and sock until the test
// ends, or stop is called.
func startDaemon(t *testing.T, state, sock string) (pid int, log *bytes.Buffer, stop func()) {
	t.Helper()
	args := []string{"serve", "--state", state, "--socket", sock, "--agent-uid", "65534", "--drift", "0", "--build", "test"}
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopDaemon(cmd, done) })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("serve ended:\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve never answered on %s:\n%s", sock, out)
		}
	}
	return cmd.Process.Pid, out, func() { stopDaemon(cmd, done) }
}

func stopDaemon(cmd *exec.Cmd, done chan struct{}) {
	select {
	case <-done:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func doctor(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errw bytes.Buffer
	code := Main("test", append([]string{"doctor"}, args...), &out, &errw)
	if errw.Len() > 0 {
		t.Errorf("doctor wrote on standard error: %s", errw.String())
	}
	return out.String(), code
}

func lineOf(t *testing.T, out, what string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if len(l) > 6 && strings.HasPrefix(l[6:], what+": ") {
			return l
		}
	}
	t.Fatalf("no %q line in\n%s", what, out)
	return ""
}

// With a real daemon on a hosted node's state, doctor says it runs and
// who it is; with the daemon stopped, that it is not running, and exits 1.
// Pointed at another state, it says the daemon answering is not that
// state's. Nothing is created.
func TestDoctorWithAndWithoutADaemon(t *testing.T) {
	dir := base(t)
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "run", "executor.sock")
	pid, log, stop := startDaemon(t, state, sock)

	out, code := doctor(t, "--state", state, "--socket", sock)
	want := map[string]string{
		"state directory": "ok    state directory: " + state + ", root's, mode 0700",
		"daemon":          "ok    daemon: running (pid " + strconv.Itoa(pid) + "), answers on " + sock,
		"identity":        "ok    identity: hosted: not enrolled; the executor takes local files and the carried bundle only",
		"link":            "ok    link: none: a hosted node has no link",
		"held":            "ok    held: none: a hosted node holds no link declaration",
		"faults":          "ok    faults: none recorded",
	}
	for what, line := range want {
		if got := lineOf(t, out, what); got != line {
			t.Errorf("running daemon, %s:\n got %q\nwant %q", what, got, line)
		}
	}
	for _, what := range []string{"clock", "disk", "init"} {
		lineOf(t, out, what)
	}
	if code != 0 {
		t.Errorf("running hosted daemon: exit %d\n%s", code, out)
	}
	if strings.Contains(log.String(), "connection closed") {
		t.Errorf("the daemon logged doctor's probe:\n%s", log)
	}

	// Another state: the daemon answering on sock is not its.
	other := filepath.Join(dir, "other")
	out, _ = doctor(t, "--state", other, "--socket", sock)
	if got := lineOf(t, out, "daemon"); !strings.HasPrefix(got, "warn  daemon: "+sock+" answers (pid "+strconv.Itoa(pid)+"), but that daemon does not hold "+other) {
		t.Errorf("another state: %q", got)
	}
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Errorf("doctor made %s: %v", other, err)
	}

	// Its state, told another socket than it serves: running, said so,
	// with how to look at it.
	elsewhere := filepath.Join(dir, "elsewhere.sock")
	out, code = doctor(t, "--state", state, "--socket", elsewhere)
	if got := lineOf(t, out, "daemon"); got != "warn  daemon: mesh-executor serve (pid "+strconv.Itoa(pid)+") holds "+state+", on another socket than "+elsewhere+" (it serves "+sock+")" ||
		code != 0 || !strings.Contains(out, "fix: run doctor --socket "+sock) {
		t.Errorf("the daemon's state, another socket: exit %d\n%s", code, out)
	}
	// Its own socket gone from under it: no agent reaches it, a failure.
	os.Rename(sock, sock+".aside")
	out, code = doctor(t, "--state", state, "--socket", sock)
	if got := lineOf(t, out, "daemon"); !strings.HasPrefix(got, "fail  daemon: mesh-executor serve (pid "+strconv.Itoa(pid)+") holds "+state+" and serves "+sock+", which is gone") || code != ExitFailed {
		t.Errorf("the daemon's own socket gone: exit %d\n%s", code, out)
	}
	os.Remove(sock + ".aside")

	// The daemon stopped: no socket; exit 1; the JSON says the same.
	stop()
	out, code = doctor(t, "--state", state, "--socket", sock)
	if got, want := lineOf(t, out, "daemon"), "fail  daemon: there is no executor socket at "+sock+": mesh-executor serve is not running"; got != want {
		t.Errorf("stopped daemon:\n got %q\nwant %q", got, want)
	}
	if !strings.Contains(out, "      fix: start it through the init") {
		t.Errorf("no fix for the stopped daemon:\n%s", out)
	}
	if code != ExitFailed {
		t.Errorf("stopped daemon: exit %d, want %d", code, ExitFailed)
	}
	js, jcode := doctor(t, "--state", state, "--socket", sock, "--json")
	if err := jsonform.Check([]byte(js)); err != nil {
		t.Error(err)
	}
	var checks []check
	if err := json.Unmarshal([]byte(js), &checks); err != nil {
		t.Fatal(err)
	}
	if jcode != code || len(checks) != 10 || checks[1].Check != "daemon" || checks[1].Status != checkFail || checks[1].Fix == "" {
		t.Errorf("--json: exit %d, %+v", jcode, checks)
	}
}

// A socket left by a daemon that is gone answers nothing: doctor says so.
func TestDoctorStaleSocket(t *testing.T) {
	dir := base(t)
	sock := filepath.Join(dir, "executor.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	ch := daemonCheck(filepath.Join(dir, "state"), sock)
	if ch.Status != checkFail || ch.Detail != sock+" is left from a daemon that is gone: nothing answers on it" || ch.Fix == "" {
		t.Errorf("%+v", ch)
	}
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o600)
	if ch := daemonCheck(dir, filepath.Join(dir, "file")); ch.Status != checkFail || !strings.Contains(ch.Detail, "is not a socket") {
		t.Errorf("%+v", ch)
	}
}

func TestDoctorStateDirectory(t *testing.T) {
	dir := base(t)
	state := filepath.Join(dir, "state")
	if ch, exists := stateCheck(state); exists || ch.Status != checkOK || !strings.HasPrefix(ch.Detail, "none: ") {
		t.Errorf("absent: %+v", ch)
	}
	os.Mkdir(state, 0o755)
	os.Chmod(state, 0o755)
	if ch, _ := stateCheck(state); ch.Status != checkFail || !strings.Contains(ch.Detail, "mode 0755") || ch.Fix == "" {
		t.Errorf("0755: %+v", ch)
	}
	os.Chmod(state, 0o700)
	if ch, exists := stateCheck(state); !exists || ch.Status != checkOK {
		t.Errorf("0700: %+v", ch)
	}
	os.Symlink(state, filepath.Join(dir, "link"))
	if ch, _ := stateCheck(filepath.Join(dir, "link")); ch.Status != checkFail {
		t.Errorf("a link: %+v", ch)
	}
}

func TestDoctorDiskThresholds(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		avail, total uint64
		want         string
	}{
		{50 * gib, 100 * gib, checkOK},
		{11 * gib, 100 * gib, checkOK},
		{9 * gib, 100 * gib, checkWarn},   // under a tenth
		{60 << 20, 200 << 20, checkWarn},  // under 64 MiB, though 30%
		{100 << 20, 200 << 20, checkOK},   // 50%, over 64 MiB
		{512 << 10, 100 * gib, checkFail}, // under 1 MiB
		{0, 0, checkFail},
	} {
		if got := diskStatus(c.avail, c.total); got != c.want {
			t.Errorf("diskStatus(%d, %d) = %s, want %s", c.avail, c.total, got, c.want)
		}
	}
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 64 << 20: "64.0 MiB", 3 << 40: "3.0 TiB"} {
		if got := size(n); got != want {
			t.Errorf("size(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestDoctorIdentityAndLink(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	id := &identity.Identity{Node: "web1", Enrolment: "e1", ControlKey: make([]byte, 32)}
	if ch := identityCheck(true, id, nil, nil, nil, now); ch.Status != checkOK || !strings.HasPrefix(ch.Detail, "enrolled: node web1 (enrolment e1), control key ") {
		t.Errorf("enrolled: %+v", ch)
	}
	if ch := identityCheck(true, nil, errors.New("identity: bad"), nil, nil, now); ch.Status != checkFail || ch.Fix == "" {
		t.Errorf("unreadable: %+v", ch)
	}
	p := &enrol.PendingView{Token: "abcd", Begun: now, Expires: now.Add(time.Hour)}
	if ch := identityCheck(true, nil, nil, p, nil, now); ch.Status != checkOK || !strings.Contains(ch.Detail, "an enrolment is pending (token abcd") {
		t.Errorf("pending: %+v", ch)
	}
	p.Expired = true
	if ch := identityCheck(true, nil, nil, p, nil, now); ch.Status != checkWarn || !strings.Contains(ch.Fix, "enrol --cancel") {
		t.Errorf("expired: %+v", ch)
	}
	// A rekey asked for: said while the answer may come, warned about once
	// it is long awaited.
	rk := &enrol.RekeyView{Node: "web1", Enrolment: "e1", Begun: now.Add(-time.Minute)}
	if ch := identityCheck(true, id, nil, nil, rk, now); ch.Status != checkOK || !strings.Contains(ch.Detail, "a rekey is asked for since "+stamp(rk.Begun)) {
		t.Errorf("rekey: %+v", ch)
	}
	rk.Begun = now.Add(-time.Hour)
	if ch := identityCheck(true, id, nil, nil, rk, now); ch.Status != checkWarn || !strings.Contains(ch.Fix, "rekey --cancel") {
		t.Errorf("rekey long awaited: %+v", ch)
	}

	since := now.Add(-time.Hour)
	for _, c := range []linkCase{
		{"hosted", false, nil, checkOK, "none: a hosted node has no link"},
		{"never said", true, nil, checkWarn, "the agent has never told the executor of its link"},
		{"linked", true, &serve.LinkState{Up: true, Since: since, SaidAt: now}, checkOK, "linked since " + stamp(since)},
		{"disconnected", true, &serve.LinkState{Since: since, SaidAt: now}, checkWarn, "disconnected since " + stamp(since) + " (1h0m0s ago)"},
		{"disconnected, saying why", true, &serve.LinkState{Since: since, SaidAt: now, LastError: "broker unreachable at tls://10.0.0.1:4222: connection refused"}, checkWarn,
			"disconnected since " + stamp(since) + " (1h0m0s ago); the agent's last error: broker unreachable at tls://10.0.0.1:4222: connection refused"},
		{"revoked", true, &serve.LinkState{Since: since, Revoked: since, SaidAt: now}, checkFail, "revoked by the control side at " + stamp(since) + " (1h0m0s ago): the broker refuses this node's credential"},
		{"silent", true, &serve.LinkState{Up: true, Since: since, SaidAt: since}, checkWarn, "linked since " + stamp(since) + "; but the agent has said nothing since " + stamp(since) + ": is it running?"},
	} {
		ch := linkCheck(c.enrolled, c.l, nil, now)
		if ch.Status != c.status || ch.Detail != c.detail || (ch.Status != checkOK) != (ch.Fix != "") {
			t.Errorf("%s: %+v\nwant %s %q", c.name, ch, c.status, c.detail)
		}
	}
}

// linkCase is a check of what the agent last said (linkCheck,
// clockCheck): enrolled or not, the link file, and the status and detail
// doctor says of it.
type linkCase struct {
	name     string
	enrolled bool
	l        *serve.LinkState
	status   string
	detail   string
}

// The clock against the control side's, as the agent measured it: said
// either way, and past a minute a warning with what to do.
func TestDoctorClock(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []linkCase{
		{"hosted", false, nil, checkOK, "not measured: a hosted node has no broker to measure against"},
		{"not yet", true, &serve.LinkState{Up: true}, checkOK, "not measured yet: the agent measures it"},
		{"close", true, &serve.LinkState{ClockSkewMS: 250, ClockAt: at}, checkOK, "250ms ahead of the broker's (the control side's), as the agent measured at " + stamp(at)},
		{"behind", true, &serve.LinkState{ClockSkewMS: -(3 * time.Hour).Milliseconds(), ClockAt: at}, checkWarn, "3h0m0s behind the broker's (the control side's), as the agent measured at " + stamp(at)},
		{"ahead a minute", true, &serve.LinkState{ClockSkewMS: time.Minute.Milliseconds(), ClockAt: at}, checkWarn, "1m0s ahead of the broker's"},
	} {
		ch := clockCheck(c.enrolled, c.l)
		if ch.Status != c.status || !strings.HasPrefix(ch.Detail, c.detail) || !strings.Contains(ch.Detail, "; this clock reads ") || (ch.Status != checkOK) != (ch.Fix != "") {
			t.Errorf("%s: %+v\nwant %s %q…", c.name, ch, c.status, c.detail)
		}
	}
}

func TestDoctorFaults(t *testing.T) {
	if ch := faultsCheck(serve.Faults{}, nil); ch.Status != checkOK {
		t.Errorf("%+v", ch)
	}
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	ch := faultsCheck(serve.Faults{Recovered: 3, LastAt: at, LastIn: "plan", LastPanic: "index out of range"}, nil)
	if ch.Status != checkWarn || ch.Detail != "3 internal errors recovered (the daemon went on); the newest at "+stamp(at)+" serving plan: index out of range" || ch.Fix == "" {
		t.Errorf("%+v", ch)
	}
}

// The rescue file last applied is reconciled only while it is addressed
// to this node: one of another name (the machine enrolled again as
// another node), or one naming a node on a hosted machine, is refused at
// each drift look — said, with what to do.
func TestDoctorRescue(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	id := &identity.Identity{Node: "n1b", Enrolment: "e2", ControlKey: make([]byte, 32)}
	if ch := rescueCheck(true, st, id); ch.Status != checkOK || ch.Detail != "no rescue file applied" {
		t.Errorf("none: %+v", ch)
	}
	if ch := rescueCheck(false, nil, nil); ch.Status != checkOK || ch.Detail != "no rescue file applied (no state yet)" {
		t.Errorf("no state: %+v", ch)
	}
	for _, c := range []struct {
		node   string
		id     *identity.Identity
		status string
		says   string
	}{
		{"n1b", id, checkOK, "the rescue file last applied (1 resource(s)) is reconciled at each drift look"},
		{"n1", id, checkWarn, `refused at each drift look (the declaration is addressed to node "n1"; this is node "n1b"): not reconciled`},
		// Applied before the machine was enrolled: reconciled still.
		{"", id, checkOK, "reconciled at each drift look"},
		// On a hosted machine a node is checked by none.
		{"n1", nil, checkOK, "reconciled at each drift look"},
		{"", nil, checkOK, "reconciled at each drift look"},
	} {
		doc := `{"version":1,"node":"` + c.node + `","resources":[{"module":"m","id":"f","type":"file","path":"/srv/x","content":"x"}]}`
		if c.node == "" {
			doc = `{"version":1,"resources":[{"module":"m","id":"f","type":"file","path":"/srv/x","content":"x"}]}`
		}
		if err := st.SaveTarget(store.Local, []byte(doc)); err != nil {
			t.Fatal(err)
		}
		ch := rescueCheck(true, st, c.id)
		if ch.Status != c.status || !strings.Contains(ch.Detail, c.says) || (ch.Status != checkOK) != (ch.Fix != "") {
			t.Errorf("%q for %v: %+v", c.node, c.id, ch)
		}
	}
}

// A store the daemon refuses to start on (its journal damaged) is a
// failure of the state directory, said with the store's own words, not
// an "ok" beside a daemon that will not start; and a state on a
// filesystem mounted read-only is one too.
func TestDoctorSaysAStoreThatDoesNotRead(t *testing.T) {
	dir := base(t)
	state := filepath.Join(dir, "state")
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Lock(time.Second); err != nil {
		t.Fatal(err)
	}
	st.Put(&store.Entry{Target: "path:/x", Type: "file", Claims: []store.Claim{{Source: store.Local, Module: "m", ID: "x"}}})
	st.Put(&store.Entry{Target: "path:/y", Type: "file", Claims: []store.Claim{{Source: store.Local, Module: "m", ID: "y"}}})
	st.Commit()
	st.Unlock()
	j := filepath.Join(state, "journal")
	b, err := os.ReadFile(j)
	if err != nil || len(b) < 20 {
		t.Fatalf("%d %v", len(b), err)
	}
	b[10] ^= 0xff
	os.WriteFile(j, b, 0o600)
	out, code := doctor(t, "--state", state, "--socket", filepath.Join(dir, "none.sock"))
	if l := lineOf(t, out, "state directory"); code != ExitFailed || !strings.HasPrefix(l, "fail") || !strings.Contains(l, "its store does not read: store: the journal is damaged") {
		t.Fatalf("exit %d:\n%s", code, out)
	}

	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o700)
	if err := unix.Mount("tmpfs", ro, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(ro, unix.MNT_DETACH)
	if _, err := store.Open(filepath.Join(ro, "state")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	out, code = doctor(t, "--state", filepath.Join(ro, "state"), "--socket", filepath.Join(dir, "none.sock"))
	if l := lineOf(t, out, "state directory"); code != ExitFailed || !strings.Contains(l, "mounted read-only") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
