package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The attacks: each test sets up what an attacker would, against the real
// programs of the machine, and fails if it works.

// A directory first on the test process's PATH holds a fake getent (the
// name also in /usr/bin) that writes a marker. Running the bare name must
// run the machine's getent, and the marker is never written.
func TestBareNameNeverFromInheritedPATH(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(t.TempDir(), "ran")
	fake := filepath.Join(dir, "getent")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho planted > "+marker+"\necho root:x:6666:6666::/:/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	// The attack is real: a runner using the inherited PATH would run it.
	if p, err := exec.LookPath("getent"); err != nil || p != fake {
		t.Fatalf("setup: exec.LookPath(getent) = %q, %v; want the fake %s", p, err, fake)
	}

	p, err := LookPath("getent")
	if err != nil || p == fake || !strings.Contains(":"+SearchPath+":", ":"+filepath.Dir(p)+":") {
		t.Fatalf("LookPath(getent) = %q, %v; want one in %s", p, err, SearchPath)
	}
	res, err := Run(t.Context(), []string{"getent", "passwd", "root"}, Options{})
	if err != nil || res.Code != 0 || !strings.HasPrefix(res.Stdout, "root:x:0:0:") {
		t.Fatalf("getent passwd root: %+v, %v", res, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the planted getent ran")
	}
	// A name only the planted directory has is not found at all.
	if err := os.WriteFile(filepath.Join(dir, "nox-only-planted"), []byte("#!/bin/sh\necho planted > "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(t.Context(), []string{"nox-only-planted"}, Options{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a name only on the inherited PATH: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the planted program ran")
	}
}

// Variables set in the executor's environment (LD_PRELOAD, a sentinel) do
// not reach the program: /usr/bin/env prints exactly PATH, LC_ALL and what
// the caller gave.
func TestEnvironmentIsOnlyItsOwn(t *testing.T) {
	t.Setenv("LD_PRELOAD", "/nonexistent.so")
	t.Setenv("NOX_SENTINEL", "leaked")
	t.Setenv("LC_ALL", "de_DE.UTF-8")
	t.Setenv("HOME", "/root/attacker")
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"none given", nil, "PATH=" + SearchPath + "\nLC_ALL=C"},
		{"one given", []string{"DEBIAN_FRONTEND=noninteractive"}, "PATH=" + SearchPath + "\nLC_ALL=C\nDEBIAN_FRONTEND=noninteractive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := Run(t.Context(), []string{"/usr/bin/env"}, Options{Env: c.env})
			if err != nil || res.Code != 0 {
				t.Fatalf("%+v, %v", res, err)
			}
			if res.Stdout != c.want {
				t.Fatalf("environment:\n%s\nwant:\n%s", res.Stdout, c.want)
			}
			if res.Stderr != "" {
				t.Fatalf("stderr (a loader told of LD_PRELOAD?): %q", res.Stderr)
			}
		})
	}
	// Stdin is /dev/null and the working directory is /.
	res, err := Run(t.Context(), []string{"sh", "-c", "readlink /proc/self/fd/0; pwd"}, Options{})
	if err != nil || res.Stdout != "/dev/null\n/" {
		t.Fatalf("stdin and directory: %+v, %v", res, err)
	}
	// PATH and LC_ALL cannot be replaced through Env, nor a malformed one given.
	for _, kv := range []string{"PATH=/tmp", "LC_ALL=de_DE.UTF-8", "NOEQUALS", "=x"} {
		if _, err := Run(t.Context(), []string{"/usr/bin/env"}, Options{Env: []string{kv}}); err == nil {
			t.Errorf("Env %q accepted", kv)
		}
	}
}

// A program that forks a grandchild and hangs: at the deadline the whole
// group is killed, and when Run returns the grandchild is dead (gone, or a
// zombie its new parent has not reaped yet).
func TestTimeoutKillsTheWholeGroup(t *testing.T) {
	const d = 300 * time.Millisecond
	for _, c := range []struct {
		name    string
		opts    Options
		ctx     string // "deadline": the caller's context has one; "cancel": the caller cancels it
		wording string
		why     error
	}{
		{"the timeout passes", Options{Timeout: d}, "", "killed, no answer in time", context.DeadlineExceeded},
		{"the caller's deadline passes", Options{}, "deadline", "killed, no answer in time", context.DeadlineExceeded},
		{"the caller cancels", Options{}, "cancel", "killed: context canceled", context.Canceled},
		{"in a session of its own", Options{Timeout: d, Session: true}, "", "killed, no answer in time", context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			switch c.ctx {
			case "deadline":
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			case "cancel":
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer time.AfterFunc(d, cancel).Stop()
			}
			argv := []string{"sh", "-c", "sleep 300 & echo $!; wait"}
			start := time.Now()
			res, err := Run(ctx, argv, c.opts)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), `["sh" "-c" "sleep 300 & echo $!; wait"] `+c.wording) || !errors.Is(err, c.why) {
				t.Fatalf("err %v; want %q wrapping %v", err, c.wording, c.why)
			}
			if res.Code != -1 {
				t.Errorf("code %d for a killed program, want -1", res.Code)
			}
			if took > d+waitDelay+time.Second {
				t.Errorf("Run took %v", took)
			}
			pid, perr := strconv.Atoi(res.Stdout)
			if perr != nil || pid <= 1 {
				t.Fatalf("grandchild pid %q: %v", res.Stdout, perr)
			}
			if state := processState(pid); state != "" && state != "Z" {
				// Let the kernel finish delivering the signal, then look again.
				time.Sleep(100 * time.Millisecond)
				if state = processState(pid); state != "" && state != "Z" {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Fatalf("grandchild %d survived Run (state %s)", pid, state)
				}
			}
		})
	}
}

// processState is the state letter /proc gives pid ("S", "Z", ...), or ""
// when there is no such process.
func processState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// Ten megabytes on either stream: the program is never blocked, Run comes
// back promptly, and exactly OutputLimit bytes are kept.
func TestOutputCappedAndDrained(t *testing.T) {
	for _, c := range []struct {
		name string
		argv []string
		out  func(Result) string
	}{
		{"stdout", []string{"head", "-c", "10000000", "/dev/zero"}, func(r Result) string { return r.Stdout }},
		{"stderr", []string{"sh", "-c", "head -c 10000000 /dev/zero >&2"}, func(r Result) string { return r.Stderr }},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			res, err := Run(t.Context(), c.argv, Options{Timeout: 20 * time.Second})
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v", took)
			}
			if err != nil || res.Code != 0 {
				t.Fatalf("%v exit %d: %v", c.argv, res.Code, err)
			}
			if got := c.out(res); len(got) != OutputLimit || strings.Trim(got, "\x00") != "" {
				t.Fatalf("kept %d bytes, want exactly %d of zeros", len(got), OutputLimit)
			}
		})
	}
}

// Named by an absolute path, a program must be an executable regular file;
// a relative name with a slash is refused outright.
func TestRefusedNames(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := "#!/bin/sh\necho ran > " + marker + "\n"
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte(script), 0o644)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o755); err != nil {
		t.Fatal(err)
	}
	xdir := filepath.Join(dir, "xdir")
	os.Mkdir(xdir, 0o755)
	for _, c := range []struct {
		name, want string
		notFound   bool
	}{
		{plain, "is not an executable regular file", false},
		{fifo, "is not an executable regular file", false},
		{xdir, "is not an executable regular file", false},
		{"/dev/null", "is not an executable regular file", false},
		{filepath.Join(dir, "missing"), "not found", true},
		{"./plain", "neither an absolute path nor a bare name", false},
		{"sub/plain", "neither an absolute path nor a bare name", false},
		{"", "neither an absolute path nor a bare name", false},
		{"..", "neither an absolute path nor a bare name", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if p, err := LookPath(c.name); err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, ErrNotFound) != c.notFound {
				t.Fatalf("LookPath(%q) = %q, %v; want %q", c.name, p, err, c.want)
			}
			if _, err := Run(t.Context(), []string{c.name}, Options{}); err == nil {
				t.Fatalf("Run(%q) ran", c.name)
			}
		})
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a refused file ran")
	}
	// The same file made executable runs, named absolutely.
	os.Chmod(plain, 0o755)
	if res, err := Run(t.Context(), []string{plain}, Options{}); err != nil || res.Code != 0 {
		t.Fatalf("an executable file by absolute path: %+v, %v", res, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the executable file did not run")
	}
}

// A non-zero exit is an answer, not an error; stdout and stderr are kept
// apart and trimmed.
func TestExitStatusIsAnAnswer(t *testing.T) {
	res, err := Run(t.Context(), []string{"sh", "-c", "echo ' out '; echo err >&2; exit 3"}, Options{})
	if err != nil || res.Code != 3 || res.Stdout != "out" || res.Stderr != "err" || len(res.Argv) != 3 {
		t.Fatalf("%+v, %v", res, err)
	}
	// Killed by a signal of its own, not by Run: an error, naming argv.
	res, err = Run(t.Context(), []string{"sh", "-c", "kill -KILL $$"}, Options{})
	if err == nil || !strings.Contains(err.Error(), `command: ["sh" "-c" "kill -KILL $$"]: signal: killed`) || res.Code != -1 {
		t.Fatalf("%+v, %v", res, err)
	}
}

// A program that exits leaving a process that holds its output: its exit
// is the answer, Run does not wait for the leftover past waitDelay, and
// does not kill it (an init's tool leaves its daemon running).
func TestLeftoverHoldingOutput(t *testing.T) {
	start := time.Now()
	res, err := Run(t.Context(), []string{"sh", "-c", "sleep 30 & echo $!"}, Options{})
	took := time.Since(start)
	pid, _ := strconv.Atoi(res.Stdout)
	if pid > 1 {
		defer syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil || res.Code != 0 || pid <= 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	if took > waitDelay+2*time.Second {
		t.Errorf("took %v", took)
	}
	if s := processState(pid); s == "" || s == "Z" {
		t.Errorf("the leftover %d was killed (state %q)", pid, s)
	}
}

// Session: the program leads a session of its own; otherwise only a
// process group of its own, in the executor's session.
func TestSessionAndGroup(t *testing.T) {
	script := `read -r pid comm state ppid pgrp sid rest < /proc/$$/stat; echo "$pid $pgrp $sid"`
	for _, session := range []bool{false, true} {
		res, err := Run(t.Context(), []string{"sh", "-c", script}, Options{Session: session})
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(res.Stdout)
		if len(f) != 3 {
			t.Fatalf("%q", res.Stdout)
		}
		if f[0] != f[1] {
			t.Errorf("session %v: pid %s leads no group (pgrp %s)", session, f[0], f[1])
		}
		if (f[0] == f[2]) != session {
			t.Errorf("session %v: pid %s, session %s", session, f[0], f[2])
		}
	}
}

// A program someone other than root (or the executor's own user) could
// have replaced is not run: owned by another uid, writable by its group or
// others, in a directory another could write, or reached through a link
// into such a place. Found in the search path, the refusal is what is said
// when no other copy is found.
func TestProgramsOthersCouldReplaceAreRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the cases are files owned by another uid")
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := []byte("#!/bin/sh\necho ran >> " + marker + "\n")
	write := func(p string, mode os.FileMode, uid int) string {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, script, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		os.Chown(p, uid, 0)
		return p
	}
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	safe := filepath.Join(dir, "safe")
	os.Mkdir(safe, 0o755)
	cases := []struct{ p, want string }{
		{write(filepath.Join(dir, "other-owned"), 0o755, 12345), "owned by uid 12345"},
		{write(filepath.Join(dir, "group-writable"), 0o775, 0), "mode 0775"},
		{write(filepath.Join(dir, "world-writable"), 0o757, 0), "mode 0757"},
		{write(filepath.Join(open, "tool"), 0o755, 0), "mode 0777"},
	}
	// A link in a safe directory to a program in the open one.
	os.Symlink(filepath.Join(open, "tool"), filepath.Join(safe, "tool"))
	cases = append(cases, struct{ p, want string }{filepath.Join(safe, "tool"), "mode 0777"})
	for _, c := range cases {
		if _, err := LookPath(c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LookPath(%s) = %v; want a refusal saying %q", c.p, err, c.want)
		}
		if _, err := Run(t.Context(), []string{c.p}, Options{}); err == nil {
			t.Errorf("Run(%s) ran", c.p)
		}
	}
	// Found by its bare name: the refusal is said, not "not found".
	if _, err := Run(t.Context(), []string{"tool"}, Options{Path: open}); err == nil || !strings.Contains(err.Error(), "mode 0777") {
		t.Errorf("a bare name found only in an open directory: %v", err)
	}
	// A later safe copy is found past a refused one.
	good := write(filepath.Join(dir, "good", "tool"), 0o755, 0)
	if p, err := lookPath("tool", open+":"+filepath.Dir(good)); err != nil || p != good {
		t.Errorf("lookPath past a refused copy = %q, %v; want %s", p, err, good)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a program others could replace ran as root")
	}
	// The positive control: the same script, root's and 0755 in a safe
	// directory, runs.
	ok := write(filepath.Join(safe, "ok"), 0o755, 0)
	if res, err := Run(t.Context(), []string{ok}, Options{}); err != nil || res.Code != 0 {
		t.Fatalf("a program only root could write: %+v, %v", res, err)
	}
}

// A directory others could write is neither searched nor handed on: a
// program root runs gets a PATH without it, so a helper it runs by name
// (dpkg's ldconfig) cannot be planted there.
func TestOpenDirectoriesLeftOutOfTheChildsPATH(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tool and the planted helper are root's files")
	}
	dir := t.TempDir()
	open, safe := filepath.Join(dir, "open"), filepath.Join(dir, "safe")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o2775) // root:staff-style, group-writable
	os.Mkdir(safe, 0o755)
	marker := filepath.Join(dir, "helper-ran")
	os.WriteFile(filepath.Join(open, "helper"), []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755)
	os.WriteFile(filepath.Join(safe, "pkgtool"), []byte("#!/bin/sh\necho \"$PATH\"\nhelper\nexit 0\n"), 0o755)
	res, err := Run(t.Context(), []string{"pkgtool"}, Options{Path: open + ":" + safe + ":/usr/bin:/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, open) || !strings.Contains(res.Stdout, safe) {
		t.Fatalf("the program's PATH is %q; it must hold %s and not %s", res.Stdout, safe, open)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a helper planted in a group-writable directory ran as root through the PATH a tool was given")
	}
	if got := SafePath(open + ":" + safe + ":relative:/usr/bin"); got != safe+":/usr/bin" {
		t.Fatalf("SafePath = %q", got)
	}
}

// What LookPath checked is what runs: the file itself, every link
// resolved. A link in a directory others can write, flipped to another
// program while root runs the tool again and again, never gets that
// program run.
func TestALinkOnTheWayCannotBeSwappedBetweenCheckAndExec(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attacker's program is another uid's")
	}
	dir := t.TempDir()
	open, safe := filepath.Join(dir, "open"), filepath.Join(dir, "safe")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o777)
	os.Mkdir(safe, 0o755)
	marker := filepath.Join(dir, "theirs-ran")
	theirs := filepath.Join(open, "theirs")
	os.WriteFile(theirs, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755)
	os.Chown(theirs, 65534, 65534)
	mid := filepath.Join(open, "mid")
	os.Symlink("/bin/true", mid)
	os.Symlink(mid, filepath.Join(safe, "tool"))
	if p, err := LookPath(filepath.Join(safe, "tool")); err != nil || p != mustReal(t, "/bin/true") {
		t.Fatalf("LookPath through a link = %q, %v; want the file itself, %s", p, err, mustReal(t, "/bin/true"))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			target := "/bin/true"
			if i%2 == 1 {
				target = theirs
			}
			tmp := mid + ".new"
			os.Remove(tmp)
			os.Symlink(target, tmp)
			os.Rename(tmp, mid)
		}
	}()
	for range 400 {
		Run(t.Context(), []string{filepath.Join(safe, "tool")}, Options{})
	}
	close(stop)
	<-done
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a program swapped in through a link on the way ran as root")
	}
}

func mustReal(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A package manager stopped at its deadline is stopped gently: the program
// itself is asked to stop, and the back end it started (dpkg, in the middle
// of its transaction) finishes rather than leave the database half
// configured. Without Gentle the whole group is killed.
func TestGentleStopLetsTheBackEndFinish(t *testing.T) {
	dir := t.TempDir()
	for _, gentle := range []bool{true, false} {
		marker := filepath.Join(dir, fmt.Sprintf("finished-%v", gentle))
		script := fmt.Sprintf("(sleep 1; touch %s) & wait", marker)
		res, err := Run(t.Context(), []string{"/bin/sh", "-c", script}, Options{Timeout: 200 * time.Millisecond, Gentle: gentle})
		if err == nil {
			t.Fatalf("gentle=%v: a program past its deadline answered: %+v", gentle, res)
		}
		time.Sleep(1500 * time.Millisecond)
		_, statErr := os.Stat(marker)
		if finished := statErr == nil; finished != gentle {
			t.Errorf("gentle=%v: the back end finished = %v", gentle, finished)
		}
	}
}
