package initsys

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestOpenRCStatus(t *testing.T) {
	for _, c := range []struct {
		code        int
		running, ok bool
	}{
		{0, true, true},    // status: started
		{3, false, true},   // status: stopped
		{1, false, false},  // no such service, or rc-service itself failed
		{4, false, false},  // stopping
		{8, false, false},  // starting
		{16, false, false}, // inactive
		{32, false, false}, // crashed
		{-1, false, false}, // killed
	} {
		running, ok := openrcStatus(c.code)
		if running != c.running || ok != c.ok {
			t.Errorf("exit %d: running=%v ok=%v, want %v %v", c.code, running, ok, c.running, c.ok)
		}
	}
}

func TestSvStatus(t *testing.T) {
	for _, c := range []struct {
		out                     string
		code                    int
		running, supervised, ok bool
	}{
		{"run: /etc/service/lp-web: (pid 96) 1s", 0, true, true, true},
		{"run: /etc/service/lp-web: (pid 96) 12s; run: log: (pid 95) 12s", 0, true, true, true},
		{"run: /etc/service/lp-web: (pid 96) 0s, normally down, want down", 0, true, true, true},
		{"down: /etc/service/lp-web: 3s, normally up", 0, false, true, true},
		{"down: /etc/sv/lp-web: 0s", 0, false, true, true},
		{"finish: /etc/service/lp-web: (pid 120) 0s, normally up", 0, false, true, true},
		{"\nfail: /etc/sv/lp-web: runsv not running", 1, false, false, true},
		{"warning: /etc/sv/lp-web: unable to open supervise/ok: file does not exist", 1, false, false, true},
		// Not understood: an error, never a guess.
		{"fail: /etc/sv/lp-web: unable to change to service directory: file does not exist", 1, false, false, false},
		{"run: /etc/service/lp-web: (pid 96) 1s", 1, false, false, false},
		{"", 0, false, false, false},
		{"running", 0, false, false, false},
	} {
		running, supervised, ok := svStatus(c.out, c.code)
		if running != c.running || supervised != c.supervised || ok != c.ok {
			t.Errorf("%q exit %d: running=%v supervised=%v ok=%v, want %v %v %v", c.out, c.code, running, supervised, ok, c.running, c.supervised, c.ok)
		}
	}
}

func TestSvPid(t *testing.T) {
	for _, c := range []struct {
		out string
		pid int
	}{
		{"run: /etc/service/lp-web: (pid 96) 1s", 96},
		{"run: /etc/service/lp-web: (pid 4711) 0s, normally down; run: log: (pid 95) 3s\n", 4711},
		{"down: /etc/service/lp-web: 1s, normally up", 0},
		{"finish: /etc/service/lp-web: (pid 120) 0s, normally up", 0},
		{"fail: /etc/sv/lp-web: runsv not running", 0},
		{"run: /etc/service/lp-web: (pid x) 1s", 0},
		{"", 0},
	} {
		if got := svPid(c.out); got != c.pid {
			t.Errorf("%q: %d, want %d", c.out, got, c.pid)
		}
	}
}

func TestSvstatUp(t *testing.T) {
	for _, c := range []struct {
		out                     string
		code                    int
		running, supervised, ok bool
	}{
		{"true\n", 0, true, true, true},
		{"false\n", 0, false, true, true},
		{"", 1, false, false, true}, // s6-supervise not running
		{"up (pid 86) 1 seconds", 0, false, false, false},
		{"", 111, false, false, false},
		{"", 100, false, false, false},
		{"maybe", 0, false, false, false},
	} {
		running, supervised, ok := svstatUp(c.out, c.code)
		if running != c.running || supervised != c.supervised || ok != c.ok {
			t.Errorf("%q exit %d: running=%v supervised=%v ok=%v, want %v %v %v", c.out, c.code, running, supervised, ok, c.running, c.supervised, c.ok)
		}
	}
}

func TestRunsvdirArg(t *testing.T) {
	for _, c := range []struct {
		args []string
		dir  string
		ok   bool
	}{
		{[]string{"runsvdir", "-P", "/etc/service", "log: ..........."}, "/etc/service", true},
		{[]string{"runsvdir", "/etc/service"}, "/etc/service", true},
		{[]string{"runsvdir", "-P", "-H", "service"}, "service", true},
		{[]string{"runsvdir", "-P"}, "", false},
		{[]string{"runsvdir"}, "", false},
		{[]string{"runsvdir", "-x", "/etc/service"}, "", false},
	} {
		dir, ok := runsvdirArg(c.args)
		if dir != c.dir || ok != c.ok {
			t.Errorf("%q: %q %v, want %q %v", c.args, dir, ok, c.dir, c.ok)
		}
	}
}

func TestSvscanArg(t *testing.T) {
	for _, c := range []struct {
		args []string
		dir  string
		ok   bool
	}{
		{[]string{"s6-svscan", "/etc/s6/scan"}, "/etc/s6/scan", true},
		{[]string{"s6-svscan", "-t", "5000", "/run/service"}, "/run/service", true},
		{[]string{"s6-svscan", "-d3", "-X", "3", "-c", "500", "/run/service"}, "/run/service", true},
		{[]string{"s6-svscan", "--", "-odd"}, "-odd", true},
		{[]string{"s6-svscan", "-t", "5000"}, "", false},
		{[]string{"s6-svscan"}, "", false},
	} {
		dir, ok := svscanArg(c.args)
		if dir != c.dir || ok != c.ok {
			t.Errorf("%q: %q %v, want %q %v", c.args, dir, ok, c.dir, c.ok)
		}
	}
}

func TestPID1Init(t *testing.T) {
	for _, c := range []struct {
		comm, exe string
		openrc    bool
		want      string
	}{
		{"openrc-init", "/usr/sbin/openrc-init", false, "openrc"},
		{"init", "/usr/sbin/openrc-init", false, "openrc"}, // /sbin/init linked to openrc-init
		{"init", "/usr/sbin/init", true, "openrc"},         // sysvinit booting OpenRC
		{"init", "/bin/busybox", true, "openrc"},           // Alpine: busybox init and OpenRC
		{"init", "/usr/sbin/init", false, ""},              // sysvinit without OpenRC
		{"runit", "/usr/sbin/runit", false, "runit"},
		{"runit", "/usr/sbin/runit (deleted)", true, "runit"}, // upgraded under it; a leftover softlevel
		{"s6-svscan", "/usr/bin/s6-svscan", false, "s6"},
		{"s6-svscan", "/usr/bin/s6-svscan", true, "s6"},
		{"process_api", "/process_api", true, ""}, // leftovers of an openrc install decide nothing
		{"bash", "/usr/bin/bash", false, ""},
		{"", "", false, ""},
	} {
		if got := pid1Init(c.comm, c.exe, c.openrc); got != c.want {
			t.Errorf("comm %q exe %q openrc %v: %q, want %q", c.comm, c.exe, c.openrc, got, c.want)
		}
	}
}

func TestServiceName(t *testing.T) {
	for _, c := range []struct{ unit, want string }{
		{"lp-web", "lp-web"},
		{"lp-web.service", "lp-web"},
		{"getty@tty1.service", "getty@tty1"},
		{"net.eth0", "net.eth0"},
		{"x.socket", "x.socket"}, // only the systemd service suffix means the bare name
		{".service", ""},
		{"..", ""},
		{".hidden", ""},
		{"-rf", ""},
		{"a/b", ""},
		{"", ""},
	} {
		got, err := serviceName("runit", c.unit)
		if c.want == "" {
			if err == nil || !strings.Contains(err.Error(), "not a service name runit can have") {
				t.Errorf("%q: %q %v, want refused", c.unit, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %q %v, want %q", c.unit, got, err, c.want)
		}
	}
}

// fakeProc makes a /proc with the given processes.
func fakeProc(t *testing.T, procs []process, cwd map[int]string) string {
	t.Helper()
	proc := t.TempDir()
	for _, p := range procs {
		d := filepath.Join(proc, strconv.Itoa(p.pid))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "comm"), []byte(p.comm+"\n"), 0o644)
		os.WriteFile(filepath.Join(d, "stat"), []byte(strconv.Itoa(p.pid)+" ("+p.comm+") S "+strconv.Itoa(p.ppid)+" 1 1 0 -1\n"), 0o644)
		os.WriteFile(filepath.Join(d, "cmdline"), []byte(strings.Join(p.args, "\x00")+"\x00"), 0o644)
		if c, ok := cwd[p.pid]; ok {
			os.Symlink(c, filepath.Join(d, "cwd"))
		}
	}
	os.MkdirAll(filepath.Join(proc, "self"), 0o755)
	return proc
}

func TestRunsvdirScans(t *testing.T) {
	proc := fakeProc(t, []process{
		{pid: 40, ppid: 30, comm: "runsvdir", args: []string{"runsvdir", "/home/u/service"}},
		{pid: 7, ppid: 1, comm: "runsvdir", args: []string{"runsvdir", "-P", "/etc/service", "log: ..."}},
		{pid: 1, ppid: 0, comm: "runit", args: []string{"runit"}},
	}, nil)
	if dir, err := runsvdirScans(proc); err != nil || dir != "/etc/service" {
		t.Fatalf("%q %v, want the stage-2 runsvdir's /etc/service", dir, err)
	}
	proc = fakeProc(t, []process{{pid: 7, ppid: 1, comm: "runsvdir", args: []string{"runsvdir", "-P", "service"}}}, map[int]string{7: "/etc"})
	if dir, err := runsvdirScans(proc); err != nil || dir != "/etc/service" {
		t.Fatalf("relative: %q %v", dir, err)
	}
	proc = fakeProc(t, []process{{pid: 1, comm: "runit", args: []string{"runit"}}}, nil)
	if _, err := runsvdirScans(proc); err == nil || !strings.Contains(err.Error(), "no runsvdir runs") {
		t.Fatalf("none: %v", err)
	}
}

func TestSvscanScans(t *testing.T) {
	proc := fakeProc(t, []process{
		{pid: 1, comm: "s6-svscan", args: []string{"s6-svscan", "/etc/s6/scan"}},
		{pid: 50, ppid: 1, comm: "s6-svscan", args: []string{"s6-svscan", "/home/u/scan"}},
	}, map[int]string{1: "/etc/s6/scan", 50: "/home/u/scan"})
	if dir, err := svscanScans(proc); err != nil || dir != "/etc/s6/scan" {
		t.Fatalf("%q %v, want PID 1's /etc/s6/scan", dir, err)
	}
	// No readable cwd: the command line.
	proc = fakeProc(t, []process{{pid: 1, comm: "s6-svscan", args: []string{"s6-svscan", "-t", "0", "/run/service"}}}, nil)
	if dir, err := svscanScans(proc); err != nil || dir != "/run/service" {
		t.Fatalf("cmdline: %q %v", dir, err)
	}
	proc = fakeProc(t, nil, nil)
	if _, err := svscanScans(proc); err == nil || !strings.Contains(err.Error(), "no s6-svscan runs") {
		t.Fatalf("none: %v", err)
	}
}

// On a host whose PID 1 is none of the inits, Detect says so and names it,
// whatever directories a package install left (this machine has
// /run/openrc and /etc/runlevels from the openrc package).
func TestDetectNamesPID1(t *testing.T) {
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		t.Skip("no /proc/1/comm")
	}
	exe, _ := os.Readlink("/proc/1/exe")
	name := strings.TrimSpace(string(comm))
	_, softlevel := os.Stat("/run/openrc/softlevel")
	if fi, err := os.Stat("/run/systemd/system"); (err == nil && fi.IsDir()) || pid1Init(name, exe, softlevel == nil) != "" {
		t.Skipf("PID 1 here is %q, an init this host drives", name)
	}
	m, err := Detect(context.Background())
	if m != nil || !errors.Is(err, ErrNoInit) || !strings.Contains(err.Error(), `pid 1 is "`+name+`"`) {
		t.Fatalf("%v %v", m, err)
	}
	t.Log(err)
}

// Android is known by its build properties and PID 1 being
// /system/bin/init; a Linux machine with another PID 1 is not.
func TestAndroid(t *testing.T) {
	for _, c := range []struct {
		name      string
		buildProp bool
		pid1      string
		want      bool
	}{
		{"android", true, "/system/bin/init", true},
		{"android, pid 1 hidden", true, "", true},
		{"linux with systemd", false, "/usr/lib/systemd/systemd", false},
		{"linux, unknown pid 1", false, "/usr/bin/process_api", false},
		{"build.prop, another init", true, "/usr/lib/systemd/systemd", false},
	} {
		root := t.TempDir()
		if c.buildProp {
			os.MkdirAll(filepath.Join(root, "system"), 0o755)
			os.WriteFile(filepath.Join(root, "system/build.prop"), []byte("ro.build.version.sdk=34\n"), 0o644)
		}
		if c.pid1 != "" {
			os.MkdirAll(filepath.Join(root, "proc/1"), 0o755)
			os.Symlink(c.pid1, filepath.Join(root, "proc/1/exe"))
		}
		if got := Android(root); got != c.want {
			t.Errorf("%s: Android = %v", c.name, got)
		}
	}
}
