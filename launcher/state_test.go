package launcher

import (
	"context"
	"errors"
	"golang.org/x/sys/unix"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The state round-trips, and a missing file is the zero state.
func TestStateRoundTrip(t *testing.T) {
	d := filepath.Join(t.TempDir(), "state")
	if err := checkDir(d, true); err != nil {
		t.Fatal(err)
	}
	if s, err := ReadState(d); err != nil || s.Halted != nil || len(s.Starts) != 0 {
		t.Fatalf("missing file: %+v, %v", s, err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	want := State{Starts: []time.Time{now}, RolledBack: &RollbackMark{At: now, Reason: "r", Reinstalled: true},
		Halted: &Mark{At: now, Reason: "h"}, HealthyAt: now, KnownGood: &KnownGood{At: now, Binaries: map[string]string{"a": "b"}},
		KnownGoodDir: "/kg"}
	if err := writeState(d, want); err != nil {
		t.Fatal(err)
	}
	got := readState(t, d)
	if !got.Starts[0].Equal(now) || got.RolledBack.Reason != "r" || !got.RolledBack.Reinstalled || got.Halted.Reason != "h" ||
		!got.HealthyAt.Equal(now) || got.KnownGood.Binaries["a"] != "b" || got.KnownGoodDir != "/kg" {
		t.Errorf("round trip: %+v", got)
	}
	fi, _ := os.Stat(filepath.Join(d, StateFile))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode())
	}
	if leftovers, _ := filepath.Glob(filepath.Join(d, ".*tmp*")); len(leftovers) != 0 {
		t.Errorf("temporaries left: %v", leftovers)
	}
}

// What is refused, and why: a link, a FIFO (without hanging), a hard link,
// someone else's file, a file others may write, and a state directory that
// is a link, someone else's, or not private.
func TestStateRefusesWhatIsNotItsOwn(t *testing.T) {
	mk := func(t *testing.T) (string, string) {
		d := filepath.Join(t.TempDir(), "state")
		os.Mkdir(d, 0o700)
		return d, filepath.Join(d, StateFile)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, d, p string)
		want  string
	}{
		{"symlink", func(t *testing.T, d, p string) {
			os.WriteFile(filepath.Join(d, "real"), []byte("{}"), 0o600)
			os.Symlink("real", p)
		}, "symbolic link"},
		{"fifo", func(t *testing.T, d, p string) { syscall.Mkfifo(p, 0o600) }, "not a regular file"},
		{"hard link", func(t *testing.T, d, p string) {
			os.WriteFile(p, []byte("{}"), 0o600)
			os.Link(p, filepath.Join(d, "other"))
		}, "hard link"},
		{"foreign", func(t *testing.T, d, p string) {
			os.WriteFile(p, []byte("{}"), 0o600)
			os.Chown(p, 12345, 12345)
		}, "owned by uid 12345"},
		{"group-writable", func(t *testing.T, d, p string) {
			os.WriteFile(p, []byte("{}"), 0o600)
			os.Chmod(p, 0o620)
		}, "writable by others"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, p := mk(t)
			tc.setup(t, d, p)
			done := make(chan error, 1)
			go func() { _, err := ReadState(d); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("ReadState = %v, want %q", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ReadState hangs")
			}
			if err := Clear(d); err == nil {
				t.Error("Clear wrote over a refused state file")
			}
			if err := Healthy(d, nil); err == nil {
				t.Error("Healthy wrote over a refused state file")
			}
		})
	}
	base := t.TempDir()
	link := filepath.Join(base, "link")
	os.Mkdir(filepath.Join(base, "real"), 0o700)
	os.Symlink("real", link)
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o755)
	foreign := filepath.Join(base, "foreign")
	os.Mkdir(foreign, 0o700)
	os.Chown(foreign, 12345, 12345)
	for _, d := range []string{link, open, foreign} {
		if err := checkDir(d, true); err == nil {
			t.Errorf("state directory %s accepted", d)
		}
		if err := Healthy(d, nil); err == nil {
			t.Errorf("Healthy used the state directory %s", d)
		}
	}
}

// A state file that does not parse stops the launcher (a person looks);
// Clear replaces it.
func TestCorruptStateClear(t *testing.T) {
	d := filepath.Join(t.TempDir(), "state")
	os.Mkdir(d, 0o700)
	os.WriteFile(filepath.Join(d, StateFile), []byte(`{"starts": [`), 0o600)
	if _, err := ReadState(d); !errors.Is(err, errCorrupt) {
		t.Fatalf("ReadState = %v, want it to say it does not parse", err)
	}
	if err := Clear(d); err != nil {
		t.Fatal(err)
	}
	readState(t, d)
}

// Never torn, never lost: two processes each do 150 read-modify-writes
// under the lock while this one reads without it in a loop. Every read
// parses and sees a count that only grows; the end holds all 300.
func TestStateNeverTornNorLost(t *testing.T) {
	d := filepath.Join(t.TempDir(), "state")
	if err := checkDir(d, true); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	var cmds []*exec.Cmd
	for i := 0; i < 2; i++ {
		c := exec.Command(self)
		c.Env = append(os.Environ(), "LAUNCHER_STUB=count", "STUB_STATE="+d, "STUB_N=150")
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		t.Cleanup(func() { c.Process.Kill() }) // before TempDir's removal, on a failure
	}
	var finished atomic.Int32
	errs := make(chan error, 2)
	for _, c := range cmds {
		go func() { errs <- c.Wait(); finished.Add(1) }()
	}
	reads, last := 0, 0
	for finished.Load() < 2 {
		s, err := ReadState(d)
		if err != nil {
			t.Fatalf("read %d: %v", reads, err)
		}
		if len(s.Starts) < last {
			t.Fatalf("read %d: %d starts after %d: an update was lost", reads, len(s.Starts), last)
		}
		last = len(s.Starts)
		reads++
	}
	for range cmds {
		if err := <-errs; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	if s := readState(t, d); len(s.Starts) != 300 {
		t.Errorf("%d starts recorded, want 300: updates were lost", len(s.Starts))
	}
	t.Logf("%d reads during 300 writes, all whole", reads)
}

// Healthy keeps the running binaries as known good, leaves a halt alone,
// and refuses to make an upgrade that is installed but not yet running
// "known good"; it still clears the counter then.
func TestHealthyKnownGood(t *testing.T) {
	l := newLab(t)
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.installed, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkDir(l.state, true); err != nil {
		t.Fatal(err)
	}
	run := func(env ...string) {
		t.Helper()
		c := exec.Command(l.installed)
		c.Env = append(os.Environ(), append(env, "LAUNCHER_STUB=healthy-self", "STUB_STATE="+l.state)...)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	seed := func() {
		t.Helper()
		if _, err := update(l.state, func(s *State) (bool, error) {
			s.Starts = []time.Time{time.Now().UTC(), time.Now().UTC()}
			s.RolledBack = &RollbackMark{At: time.Now().UTC(), Reason: "r", Reinstalled: true}
			s.Halted = &Mark{At: time.Now().UTC(), Reason: "h"}
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	seed()
	run()
	kg := filepath.Join(l.state, KnownGoodDir)
	want := sha(t, l.installed)
	if got := sha(t, filepath.Join(kg, "mesh-executor")); got != want {
		t.Fatal("the running executor was not kept as known good")
	}
	fi, _ := os.Stat(filepath.Join(kg, "mesh-executor"))
	if fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Errorf("known-good copy: %v uid %d, want 0755 and ours", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	s := readState(t, l.state)
	if len(s.Starts) != 0 || s.RolledBack != nil || s.KnownGood.Binaries["mesh-executor"] != want {
		t.Errorf("after Healthy: %+v", s)
	}
	if s.Halted == nil {
		t.Error("Healthy cleared a halt; only a person does")
	}

	// The package manager installs a new release under the running
	// executor, which then reconciles: counter cleared, known good kept.
	seed()
	run("STUB_REPLACE=1")
	if got := sha(t, filepath.Join(kg, "mesh-executor")); got != want {
		t.Error("Healthy kept a release that has not run yet as known good")
	}
	if data, _ := os.ReadFile(l.installed); !strings.Contains(string(data), "a new release") {
		t.Fatal("the stub did not install a new release")
	}
	if s := readState(t, l.state); len(s.Starts) != 0 || s.RolledBack != nil || s.KnownGood.Binaries["mesh-executor"] != want {
		t.Errorf("after Healthy with an upgrade pending: %+v", s)
	}
}

// The default reinstall: every known-good copy over its installed path,
// atomically and 0755, through a link at the installed path; names without
// a copy are left alone; no copy at all, or a copy that is not the
// launcher's own, is an error that changes nothing.
func TestCopyReinstall(t *testing.T) {
	d := t.TempDir()
	kg, bin := filepath.Join(d, "kg"), filepath.Join(d, "bin")
	os.Mkdir(kg, 0o700)
	os.Mkdir(bin, 0o755)
	os.WriteFile(filepath.Join(kg, "mesh-executor"), []byte("executor v1"), 0o755)
	os.WriteFile(filepath.Join(kg, "mesh-agent"), []byte("agent v1"), 0o755)
	os.WriteFile(filepath.Join(bin, "mesh-executor"), []byte("executor v2, broken"), 0o700)
	os.WriteFile(filepath.Join(bin, "agent-v2"), []byte("agent v2"), 0o755)
	os.Symlink("agent-v2", filepath.Join(bin, "mesh-agent"))
	installed := map[string]string{
		"mesh-executor": filepath.Join(bin, "mesh-executor"),
		"mesh-agent":    filepath.Join(bin, "mesh-agent"),
		"mesh-extra":    filepath.Join(bin, "mesh-extra"),
	}
	if err := CopyReinstall(context.Background(), kg, installed); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"mesh-executor": "executor v1", "agent-v2": "agent v1"} {
		data, _ := os.ReadFile(filepath.Join(bin, p))
		fi, _ := os.Stat(filepath.Join(bin, p))
		if string(data) != want || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %q %v, want %q 0755", p, data, fi.Mode(), want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(bin, "mesh-agent")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the link at the installed path was replaced rather than followed")
	}
	if _, err := os.Stat(filepath.Join(bin, "mesh-extra")); !os.IsNotExist(err) {
		t.Error("a name without a known-good copy was installed")
	}
	if left, _ := filepath.Glob(filepath.Join(bin, ".*")); len(left) != 0 {
		t.Errorf("temporaries left: %v", left)
	}

	empty := filepath.Join(d, "empty")
	os.Mkdir(empty, 0o700)
	if err := CopyReinstall(context.Background(), empty, installed); err == nil || !strings.Contains(err.Error(), "no known-good copy") {
		t.Errorf("reinstall from nothing = %v", err)
	}
	os.WriteFile(filepath.Join(bin, "mesh-executor"), []byte("executor v2, broken"), 0o755)
	os.WriteFile(filepath.Join(kg, "mesh-extra"), []byte("extra v1"), 0o755)
	os.Chown(filepath.Join(kg, "mesh-extra"), 12345, 12345) // last in order: the others are staged by then
	if err := CopyReinstall(context.Background(), kg, installed); err == nil {
		t.Error("reinstalled a copy someone else owns")
	}
	if data, _ := os.ReadFile(filepath.Join(bin, "mesh-executor")); string(data) != "executor v2, broken" {
		t.Error("a refused reinstall changed a binary: all are staged before any is renamed")
	}
	if left, _ := filepath.Glob(filepath.Join(bin, ".*")); len(left) != 0 {
		t.Errorf("temporaries left after a refused reinstall: %v", left)
	}
}

// A rollback by copying keeps the SELinux label of the binary it replaces
// (and of the file a link at the installed path names), not the label the
// launcher's own directory would give the copy; a binary without one gets
// none.
func TestCopyReinstallKeepsTheSELinuxLabel(t *testing.T) {
	d := t.TempDir()
	kg, bin := filepath.Join(d, "kg"), filepath.Join(d, "bin")
	os.Mkdir(kg, 0o700)
	os.Mkdir(bin, 0o755)
	const execLabel = "system_u:object_r:mesh_executor_exec_t:s0\x00"
	const agentLabel = "system_u:object_r:mesh_agent_exec_t:s0\x00"
	const kgLabel = "system_u:object_r:mesh_executor_var_lib_t:s0\x00"
	for name, label := range map[string]string{"mesh-executor": execLabel, "agent-v2": agentLabel} {
		p := filepath.Join(bin, name)
		os.WriteFile(p, []byte(name+" v2"), 0o755)
		if err := unix.Setxattr(p, selinuxLabel, []byte(label), 0); err != nil {
			if err == unix.ENOTSUP {
				t.Skipf("%s keeps no security.* attributes here (%v): nothing to carry", d, err)
			}
			t.Fatal(err)
		}
	}
	os.Symlink("agent-v2", filepath.Join(bin, "mesh-agent"))
	os.WriteFile(filepath.Join(bin, "mesh-launch"), []byte("launch v2"), 0o755) // no label
	for _, name := range []string{"mesh-executor", "mesh-agent", "mesh-launch"} {
		p := filepath.Join(kg, name)
		os.WriteFile(p, []byte(name+" v1"), 0o755)
		unix.Setxattr(p, selinuxLabel, []byte(kgLabel), 0) // what the copy would otherwise bring
	}
	installed := map[string]string{}
	for _, name := range []string{"mesh-executor", "mesh-agent", "mesh-launch"} {
		installed[name] = filepath.Join(bin, name)
	}
	if err := CopyReinstall(context.Background(), kg, installed); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"mesh-executor": execLabel, "agent-v2": agentLabel, "mesh-launch": ""} {
		p := filepath.Join(bin, name)
		data, _ := os.ReadFile(p)
		if !strings.HasSuffix(string(data), " v1") {
			t.Errorf("%s holds %q, not the known-good copy", name, data)
		}
		got, err := securityLabel(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s is labelled %q after the rollback; it was %q", name, got, want)
		}
	}
}

// A known-good copy with no room for it on its filesystem is not tried:
// said, nothing written there (it filled the filesystem, failed and was
// removed, at every reconcile, every other writer there told the disk was
// full meanwhile).
func TestAKnownGoodCopyWithNoRoomIsNotTried(t *testing.T) {
	dir := t.TempDir()
	kg := filepath.Join(dir, "kg")
	os.Mkdir(kg, 0o700)
	if err := unix.Mount("tmpfs", kg, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(kg, unix.MNT_DETACH)
	bin := filepath.Join(dir, "mesh-agent")
	if err := os.WriteFile(bin, make([]byte, 600<<10), 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, err := keepKnownGood(kg, map[string]string{"mesh-agent": bin})
	if err == nil || !strings.Contains(err.Error(), "the known-good copy needs") {
		t.Fatalf("%v", err)
	}
	if ents, _ := os.ReadDir(kg); len(ents) != 0 {
		t.Fatalf("written there: %v", ents)
	}
}
