package initsys

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The backends against fake tools: shell scripts in a directory of the
// test's own that log their argv and answer from files the test writes.
// What each backend runs is held to its argv here; the real inits are
// driven in tests/machines.

type fakeTools struct {
	t   *testing.T
	dir string // bin/ holds the scripts, log the argv lines, state/ what they answer
}

func newFakeTools(t *testing.T) *fakeTools {
	f := &fakeTools{t: t, dir: t.TempDir()}
	os.MkdirAll(filepath.Join(f.dir, "bin"), 0o755)
	os.MkdirAll(filepath.Join(f.dir, "state"), 0o755)
	return f
}

// tool writes a script named name whose body is the shell text body, after
// a line that logs its argv. $S is the state directory.
func (f *fakeTools) tool(name, body string) {
	script := "#!/bin/sh\nS=" + filepath.Join(f.dir, "state") + "\n" +
		"echo \"" + name + " $*\" >> " + filepath.Join(f.dir, "log") + "\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(f.dir, "bin", name), []byte(script), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeTools) tools(init string) tools {
	return tools{init: init, path: filepath.Join(f.dir, "bin") + ":/usr/bin:/bin", timeout: 10 * time.Second}
}

func (f *fakeTools) set(name, value string) {
	os.WriteFile(filepath.Join(f.dir, "state", name), []byte(value), 0o644)
}

// log returns the argv lines so far and forgets them.
func (f *fakeTools) log() string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "log"))
	os.Remove(filepath.Join(f.dir, "log"))
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "; ")
}

func TestToolsEnvironmentAndStdin(t *testing.T) {
	f := newFakeTools(t)
	// The shell's own environment as it was given, and whatever stdin holds.
	f.tool("probe", `tr '\0' '\n' < /proc/$$/environ; echo "stdin:$(cat)"; pwd`)
	r, err := f.tools("test").must(context.Background(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	want := "PATH=" + filepath.Join(f.dir, "bin") + ":/usr/bin:/bin\nLC_ALL=C\nstdin:\n/"
	if r.Stdout != want {
		t.Fatalf("got %q, want %q", r.Stdout, want)
	}
}

func TestToolsFailureNamesArgvExitAndOutput(t *testing.T) {
	f := newFakeTools(t)
	f.tool("grumpy", `echo "on stdout"; echo "on stderr" >&2; exit 7`)
	_, err := f.tools("openrc").must(context.Background(), "grumpy", "lp-web", "start")
	if err == nil {
		t.Fatal("exit 7 passed")
	}
	for _, w := range []string{`initsys: openrc: ["grumpy" "lp-web" "start"] exited 7`, "on stdout", "on stderr"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: lacks %q", err, w)
		}
	}
	if _, err := f.tools("openrc").run(context.Background(), "nowhere-to-be-found"); err == nil || !strings.Contains(err.Error(), "nowhere-to-be-found is not installed") {
		t.Errorf("missing tool: %v", err)
	}
}

func TestToolsTimeoutKillsTheGroup(t *testing.T) {
	f := newFakeTools(t)
	f.tool("hang", `sleep 30 & echo $! > $S/child; sleep 30`)
	tl := f.tools("s6")
	tl.timeout = 300 * time.Millisecond
	start := time.Now()
	_, err := tl.run(context.Background(), "hang")
	if err == nil || !strings.Contains(err.Error(), `["hang"] killed, no answer in time`) {
		t.Fatalf("%v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %v", time.Since(start))
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "state", "child"))
	var pid int
	for _, c := range strings.TrimSpace(string(b)) {
		pid = pid*10 + int(c-'0')
	}
	time.Sleep(100 * time.Millisecond)
	if pid == 0 || syscall.Kill(pid, 0) == nil {
		// A zombie still answers kill 0 until reaped; it must at least be dead.
		st, _ := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat")
		if pid == 0 || !strings.Contains(string(st), ") Z ") {
			t.Fatalf("the command's child %d outlived it: %s", pid, st)
		}
	}
}

func TestOpenRCBackend(t *testing.T) {
	f := newFakeTools(t)
	root := t.TempDir()
	o := &openrc{t: f.tools("openrc"), initd: filepath.Join(root, "init.d"), runlevels: filepath.Join(root, "runlevels"),
		bootLevel: []string{"sysinit", "boot", "default"}}
	for _, l := range o.bootLevel {
		os.MkdirAll(filepath.Join(o.runlevels, l), 0o755)
	}
	os.MkdirAll(o.initd, 0o755)
	os.WriteFile(filepath.Join(o.initd, "lp-web"), []byte("#!/sbin/openrc-run\n"), 0o755)
	f.tool("rc-service", `echo " * status: $(cat $S/says)"; exit $(cat $S/code)`)
	f.tool("rc-update", `echo " * service $2 added to runlevel $3"`)
	ctx := context.Background()

	if st, err := o.State(ctx, "lp-nope.service"); err != nil || st.Known || st.Name != "lp-nope" {
		t.Fatalf("missing script: %+v %v", st, err)
	}
	if f.log() != "" {
		t.Fatal("asked rc-service about a script that is not there")
	}
	f.set("code", "3")
	f.set("says", "stopped")
	st, err := o.State(ctx, "lp-web.service")
	if err != nil || st != (State{Name: "lp-web", Known: true, Enabled: "disabled"}) {
		t.Fatalf("%+v %v", st, err)
	}
	if got := f.log(); got != "rc-service lp-web status" {
		t.Fatalf("ran %q", got)
	}
	f.set("code", "0")
	os.Symlink("/etc/init.d/lp-web", filepath.Join(o.runlevels, "boot", "lp-web"))
	if st, err := o.State(ctx, "lp-web"); err != nil || !st.Running || !st.IsEnabled() {
		t.Fatalf("started, in boot: %+v %v", st, err)
	}
	f.set("code", "32")
	f.set("says", "crashed")
	if _, err := o.State(ctx, "lp-web"); err == nil || !strings.Contains(err.Error(), `["rc-service" "lp-web" "status"] exited 32 (neither started (0) nor stopped (3)): * status: crashed`) {
		t.Fatalf("crashed: %v", err)
	}
	f.log()

	// Enabling what a boot runlevel holds does nothing; disabling removes
	// it from each; enabling adds it to default.
	if err := o.SetEnabled(ctx, "lp-web", true); err != nil || f.log() != "" {
		t.Fatalf("enable an enabled script: %v", err)
	}
	os.Symlink("/etc/init.d/lp-web", filepath.Join(o.runlevels, "default", "lp-web"))
	if err := o.SetEnabled(ctx, "lp-web", false); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); got != "rc-update del lp-web boot; rc-update del lp-web default" {
		t.Fatalf("disable ran %q", got)
	}
	os.Remove(filepath.Join(o.runlevels, "boot", "lp-web"))
	os.Remove(filepath.Join(o.runlevels, "default", "lp-web"))
	if err := o.SetEnabled(ctx, "lp-web.service", true); err != nil || f.log() != "rc-update add lp-web default" {
		t.Fatalf("enable: %v", err)
	}
	f.set("code", "0")
	for _, verb := range []string{"start", "stop", "restart"} {
		var err error
		switch verb {
		case "start":
			err = o.Start(ctx, "lp-web")
		case "stop":
			err = o.Stop(ctx, "lp-web")
		case "restart":
			err = o.Restart(ctx, "lp-web")
		}
		if got := f.log(); err != nil || got != "rc-service lp-web "+verb {
			t.Fatalf("%s: ran %q: %v", verb, got, err)
		}
	}
	f.set("code", "1")
	f.set("says", "ERROR: lp-web failed to start")
	if err := o.Start(ctx, "lp-web"); err == nil || !strings.Contains(err.Error(), `["rc-service" "lp-web" "start"] exited 1: * status: ERROR: lp-web failed to start`) {
		t.Fatalf("a failed start: %v", err)
	}
	if err := o.Start(ctx, "lp-nope"); err == nil || !strings.Contains(err.Error(), "no script") {
		t.Fatalf("a missing script: %v", err)
	}
	if _, err := o.State(ctx, "../../bin/sh"); err == nil {
		t.Fatal("a path taken for a name")
	}
}

func TestRunitBackend(t *testing.T) {
	f := newFakeTools(t)
	root := t.TempDir()
	r := &runit{t: f.tools("runit"), svDir: filepath.Join(root, "sv"), scanDir: filepath.Join(root, "service"), pickUp: 3 * time.Second, wait: 10}
	os.MkdirAll(filepath.Join(r.svDir, "lp-web"), 0o755)
	os.MkdirAll(filepath.Join(r.scanDir, "lp-found"), 0o755)
	// sv: unsupervised until linked; then what $S/<name> says.
	f.tool("sv", `for d; do :; done; n=$(basename "$d")
if [ "$1" = status ]; then
  if [ ! -e "`+r.scanDir+`/$n" ]; then echo "warning: $d: unable to open supervise/ok: file does not exist"; exit 1; fi
  if [ -e "$S/$n" ]; then cat "$S/$n"; else echo "down: $d: 1s, normally up"; fi
  exit 0
fi
[ "$3" = restart ] && [ -e "$S/$n" ] && echo "run: $d: (pid 13) 0s" > "$S/$n"
echo "ok: $*"`)
	ctx := context.Background()

	st, err := r.State(ctx, "lp-web.service")
	if err != nil || st != (State{Name: "lp-web", Known: true, Enabled: "disabled"}) {
		t.Fatalf("unlinked: %+v %v", st, err)
	}
	if got := f.log(); got != "sv status "+filepath.Join(r.svDir, "lp-web") {
		t.Fatalf("ran %q", got)
	}
	if st, err := r.State(ctx, "lp-nope"); err != nil || st.Known {
		t.Fatalf("missing: %+v %v", st, err)
	}
	// Starting an unlinked service says what to declare; stopping it is
	// nothing to do.
	if err := r.Start(ctx, "lp-web"); err == nil || !strings.Contains(err.Error(), "declare it enabled to link it") {
		t.Fatalf("start unlinked: %v", err)
	}
	if err := r.Stop(ctx, "lp-web"); err != nil || strings.Contains(f.log(), "down") {
		t.Fatalf("stop unsupervised: %v", err)
	}

	// Enabling links it behind a down file, waits for sv status to answer,
	// and removes the down file: never `sv up`.
	if err := r.SetEnabled(ctx, "lp-web", true); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(r.scanDir, "lp-web")); err != nil || target != filepath.Join(r.svDir, "lp-web") {
		t.Fatalf("link: %q %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(r.svDir, "lp-web", "down")); !os.IsNotExist(err) {
		t.Fatalf("the down file stayed: %v", err)
	}
	if got := f.log(); strings.Contains(got, " up ") || !strings.HasSuffix(got, "sv status "+filepath.Join(r.scanDir, "lp-web")) {
		t.Fatalf("enable ran %q", got)
	}
	if st, err := r.State(ctx, "lp-web"); err != nil || st.Running || !st.IsEnabled() {
		t.Fatalf("linked, down: %+v %v", st, err)
	}
	f.log()
	if err := r.Start(ctx, "lp-web"); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !strings.HasSuffix(got, "sv -w 10 up "+filepath.Join(r.scanDir, "lp-web")) {
		t.Fatalf("start ran %q", got)
	}
	f.set("lp-web", "run: x: (pid 12) 3s")
	// Restart waits until sv status shows a new pid.
	if err := r.Restart(ctx, "lp-web"); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if got := f.log(); !strings.HasSuffix(got, "sv -w 10 restart "+filepath.Join(r.scanDir, "lp-web")+"; sv status "+filepath.Join(r.scanDir, "lp-web")) {
		t.Fatalf("restart ran %q", got)
	}
	// Disabling writes the down file and leaves it linked and running.
	if err := r.SetEnabled(ctx, "lp-web", false); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); got != "" {
		t.Fatalf("disable ran %q", got)
	}
	if st, err := r.State(ctx, "lp-web"); err != nil || !st.Running || st.IsEnabled() {
		t.Fatalf("disabled: %+v %v", st, err)
	}
	if err := r.Stop(ctx, "lp-web"); err != nil || !strings.HasSuffix(f.log(), "sv -w 10 down "+filepath.Join(r.scanDir, "lp-web")) {
		t.Fatalf("stop: %v", err)
	}
	// A status sv never gives is an error with sv's words.
	f.set("lp-found", "what: is this")
	if _, err := r.State(ctx, "lp-found"); err == nil || !strings.Contains(err.Error(), `exited 0 (not a status sv gives): what: is this`) {
		t.Fatalf("%v", err)
	}
}

func TestRunitPickUpTimesOut(t *testing.T) {
	f := newFakeTools(t)
	root := t.TempDir()
	r := &runit{t: f.tools("runit"), svDir: filepath.Join(root, "sv"), scanDir: filepath.Join(root, "service"), pickUp: 300 * time.Millisecond, wait: 10}
	os.MkdirAll(filepath.Join(r.svDir, "lp-web"), 0o755)
	os.MkdirAll(r.scanDir, 0o755)
	f.tool("sv", `echo "fail: $2: runsv not running"; exit 1`)
	err := r.SetEnabled(context.Background(), "lp-web", true)
	if err == nil || !strings.Contains(err.Error(), "runsvdir did not take") || !strings.Contains(err.Error(), "so it does not start on its own") {
		t.Fatalf("%v", err)
	}
	if _, err := os.Stat(filepath.Join(r.svDir, "lp-web", "down")); err != nil {
		t.Fatal("the down file went, so runsv would start it when it comes")
	}
}

func TestS6Backend(t *testing.T) {
	f := newFakeTools(t)
	scan := t.TempDir()
	s := &s6{t: f.tools("s6"), scanDir: scan, timeout: 10 * time.Second, pickUp: 2 * time.Second}
	os.MkdirAll(filepath.Join(scan, "lp-web"), 0o755)
	dir := filepath.Join(scan, "lp-web")
	// s6-svstat: not supervised until $S/sup exists; then $S/up.
	f.tool("s6-svstat", `[ -e $S/sup ] || { echo "s6-svstat: fatal: unable to read status for $4: s6-supervise not running" >&2; exit 1; }; cat $S/up`)
	f.tool("s6-svok", `[ -e $S/sup ]`)
	f.tool("s6-svscanctl", `touch $S/sup`)
	f.tool("s6-svc", `:`)
	ctx := context.Background()

	st, err := s.State(ctx, "lp-web.service")
	if err != nil || st != (State{Name: "lp-web", Known: true, Enabled: "enabled"}) {
		t.Fatalf("unsupervised: %+v %v", st, err)
	}
	if got := f.log(); got != "s6-svstat -o up "+dir {
		t.Fatalf("ran %q", got)
	}
	// Stopping what nothing supervises is nothing to do.
	if err := s.Stop(ctx, "lp-web"); err != nil || strings.Contains(f.log(), "s6-svc") {
		t.Fatalf("stop: %v", err)
	}
	// Starting first has s6-svscan take it over.
	f.set("up", "false")
	if err := s.Start(ctx, "lp-web"); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); got != "s6-svstat -o up "+dir+"; s6-svscanctl -a "+scan+"; s6-svok "+dir+"; s6-svstat -o up "+dir+"; s6-svc -wu -T 10000 -u "+dir {
		t.Fatalf("start ran %q", got)
	}
	f.set("up", "true")
	if err := s.Restart(ctx, "lp-web"); err != nil || !strings.HasSuffix(f.log(), "s6-svc -wr -T 10000 -r "+dir) {
		t.Fatalf("restart: %v", err)
	}
	if err := s.Stop(ctx, "lp-web"); err != nil || !strings.HasSuffix(f.log(), "s6-svc -wd -T 10000 -d "+dir) {
		t.Fatalf("stop: %v", err)
	}
	// Enablement is the down file, and nothing is run for it.
	if err := s.SetEnabled(ctx, "lp-web", false); err != nil || f.log() != "" {
		t.Fatalf("disable: %v", err)
	}
	if st, err := s.State(ctx, "lp-web"); err != nil || st.Enabled != "disabled" || !st.Running {
		t.Fatalf("%+v %v", st, err)
	}
	if err := s.SetEnabled(ctx, "lp-web", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "down")); !os.IsNotExist(err) {
		t.Fatalf("down file: %v", err)
	}
	f.set("up", "up (pid 86) 1 seconds")
	if _, err := s.State(ctx, "lp-web"); err == nil || !strings.Contains(err.Error(), `["s6-svstat" "-o" "up" "`+dir+`"] exited 0 (not a status s6-svstat gives): up (pid 86) 1 seconds`) {
		t.Fatalf("%v", err)
	}
	if st, err := s.State(ctx, "lp-nope"); err != nil || st.Known {
		t.Fatalf("missing: %+v %v", st, err)
	}
}

// A service linked into runsvdir's directory without a down file that runsv
// has not taken over yet (runit-helper linked it a moment ago) is started
// by runsvdir when it next looks: State and Stop wait until it is
// supervised, rather than say it is stopped (and so skip a declared stop).
// Behind a down file it is stopped, and stopping it is nothing to do.
func TestRunitWaitsForALinkedService(t *testing.T) {
	f := newFakeTools(t)
	root := t.TempDir()
	r := &runit{t: f.tools("runit"), svDir: filepath.Join(root, "sv"), scanDir: filepath.Join(root, "service"), pickUp: 3 * time.Second, wait: 10}
	os.MkdirAll(filepath.Join(r.svDir, "lp-new"), 0o755)
	os.MkdirAll(r.scanDir, 0o755)
	link := filepath.Join(r.scanDir, "lp-new")
	if err := os.Symlink(filepath.Join(r.svDir, "lp-new"), link); err != nil {
		t.Fatal(err)
	}
	// runsv takes it over (and runs it) at the third look.
	f.tool("sv", `if [ "$1" = status ]; then
  n=$(cat $S/looks 2>/dev/null || echo 0); echo $((n+1)) > $S/looks
  if [ $n -lt 2 ]; then echo "warning: $2: unable to open supervise/ok: file does not exist"; exit 1; fi
  echo "run: $2: (pid 12) 0s"; exit 0
fi
echo "ok: $*"`)
	ctx := context.Background()
	looks := "sv status " + link + "; sv status " + link + "; sv status " + link

	os.WriteFile(filepath.Join(link, "down"), nil, 0o644)
	if st, err := r.State(ctx, "lp-new"); err != nil || st.Running || st.IsEnabled() || f.log() != "sv status "+link {
		t.Fatalf("behind a down file: %+v %v", st, err)
	}
	f.set("looks", "0")
	if err := r.Stop(ctx, "lp-new"); err != nil || f.log() != "sv status "+link {
		t.Fatalf("stop behind a down file: %v", err)
	}

	os.Remove(filepath.Join(link, "down"))
	f.set("looks", "0")
	st, err := r.State(ctx, "lp-new")
	if err != nil || !st.Running || !st.IsEnabled() {
		t.Fatalf("linked, not yet taken over: %+v %v", st, err)
	}
	if got := f.log(); got != looks+"; sv status "+link {
		t.Fatalf("state ran %q", got)
	}
	f.set("looks", "0")
	if err := r.Stop(ctx, "lp-new"); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); got != looks+"; sv -w 10 down "+link {
		t.Fatalf("stop ran %q", got)
	}
}
