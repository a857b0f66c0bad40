package profile

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseOSRelease(t *testing.T) {
	for _, tc := range []struct {
		file string
		want map[string]string
	}{
		{"os-release-debian", map[string]string{"PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)", "ID": "debian", "VERSION_ID": "12"}},
		{"os-release-alpine", map[string]string{"PRETTY_NAME": "Alpine Linux v3.20", "VERSION_ID": "3.20.3"}},
		{"os-release-quoting", map[string]string{
			"PRETTY_NAME": "Single Quoted $NAME",
			"NAME":        `Say "hi" \ $HOME`,
			"ID":          "bare-value",
			"VARIANT":     "",
		}},
		{"os-release-nopretty", map[string]string{"PRETTY_NAME": "", "NAME": "Minimal"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got := parseOSRelease(readTestdata(t, tc.file))
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestParseMemTotal(t *testing.T) {
	for _, tc := range []struct {
		file    string
		want    uint64
		wantErr string
	}{
		{"meminfo", 8024840 * 1024, ""},
		{"meminfo-nototal", 0, "no MemTotal"},
		{"meminfo-badunit", 0, "unit"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseMemTotal(readTestdata(t, tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestCapEffAndPrivilege(t *testing.T) {
	for _, tc := range []struct {
		file     string
		euid     int
		lastCap  int
		present  bool
		contains string
	}{
		{"status-root", 0, 40, true, "root, full capabilities"},
		{"status-root", 0, 41, true, "41 of 42 capabilities"}, // a newer kernel knows a capability we lack
		{"status-root", 0, -1, true, "41 capabilities including CAP_SYS_ADMIN and CAP_DAC_OVERRIDE"},
		{"status-root", 1000, 40, false, "effective uid is 1000, not 0"},
		{"status-user", 1000, 40, false, "CapEff lacks CAP_SYS_ADMIN; CapEff lacks CAP_DAC_OVERRIDE"},
		{"status-container", 0, 40, false, "CapEff lacks CAP_SYS_ADMIN"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			eff, err := parseCapEff(readTestdata(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			c := privilege(tc.euid, eff, tc.lastCap)
			if c.Present != tc.present {
				t.Fatalf("present = %v, want %v (%+v)", c.Present, tc.present, c)
			}
			text := c.Detail + c.Reason
			if !strings.Contains(text, tc.contains) {
				t.Fatalf("%q does not contain %q", text, tc.contains)
			}
			if tc.file == "status-container" && strings.Contains(c.Reason, "DAC_OVERRIDE") {
				t.Fatalf("container has CAP_DAC_OVERRIDE, reason says otherwise: %q", c.Reason)
			}
		})
	}
	for _, bad := range []string{"status-malformed", "status-nocapeff"} {
		if _, err := parseCapEff(readTestdata(t, bad)); err == nil || !strings.HasPrefix(err.Error(), "profile: ") {
			t.Errorf("%s: err = %v, want a profile: error", bad, err)
		}
	}
}

func TestDRMConnectors(t *testing.T) {
	got, seen := drmConnectors(filepath.Join("testdata", "drm"))
	if want := []string{"card0-eDP-1", "card1-DP-1"}; !reflect.DeepEqual(got, want) || seen != 4 {
		t.Fatalf("got %v of %d, want %v of 4", got, seen, want)
	}
	if got, seen := drmConnectors(filepath.Join("testdata", "drm-none")); len(got) != 0 || seen != 1 {
		t.Fatalf("drm-none: got %v of %d", got, seen)
	}
	if got, seen := drmConnectors(filepath.Join("testdata", "no-such-dir")); len(got) != 0 || seen != 0 {
		t.Fatalf("missing dir: got %v of %d", got, seen)
	}
	// The same through the probe, with the fake tree as /sys/class/drm.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/class"), 0o755); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join("testdata", "drm"))
	if err := os.Symlink(abs, filepath.Join(root, "sys/class/drm")); err != nil {
		t.Fatal(err)
	}
	if c := probeSeat(t.Context(), Options{Root: root}); !c.Present || c.Detail != "card0-eDP-1, card1-DP-1" {
		t.Fatalf("probeSeat = %+v", c)
	}
	if c := probeSeat(t.Context(), Options{Root: t.TempDir()}); c.Present || c.Reason == "" {
		t.Fatalf("probeSeat on empty root = %+v", c)
	}
}

func TestParseSystemState(t *testing.T) {
	for _, tc := range []struct {
		out     string
		state   string
		present bool
	}{
		{"running\n", "running", true},
		{"degraded\n", "degraded", true}, // exits 1, still an answer
		{"starting", "starting", true},
		{"initializing", "initializing", true},
		{"maintenance", "maintenance", true},
		{"stopping", "stopping", true},
		{"offline\n", "offline", false},
		{"unknown", "unknown", false},
		{"", "", false},
		{"Failed to connect to bus: No such file or directory", "Failed to connect to bus: No such file or directory", false},
	} {
		state, ok := parseSystemState(tc.out)
		if state != tc.state || ok != tc.present {
			t.Errorf("parseSystemState(%q) = %q, %v; want %q, %v", tc.out, state, ok, tc.state, tc.present)
		}
	}
}

func TestParsePing(t *testing.T) {
	for _, tc := range []struct {
		file    string
		server  string
		wantErr string
	}{
		{"ping-docker", "Docker/24.0.7 (linux)", ""},
		{"ping-podman", "libpod API 4.3.1", ""},
		{"ping-chunked", "Chunky/1", ""},
		{"ping-500", "", "answered 500"},
		{"ping-wrongbody", "", `body "NOPE"`},
		{"ping-truncated", "", "unexpected EOF"},
		{"ping-nothttp", "", "malformed HTTP answer"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			server, err := parsePing([]byte(readTestdata(t, tc.file)))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || server != tc.server {
				t.Fatalf("got %q, %v; want %q", server, err, tc.server)
			}
		})
	}
}

func TestParseStatAndSupervisor(t *testing.T) {
	comm, ppid, err := parseStat("123 (odd) name (x)) S 1 123 123 0")
	if err != nil || comm != "odd) name (x)" || ppid != 1 {
		t.Fatalf("parseStat = %q, %d, %v", comm, ppid, err)
	}
	if _, _, err := parseStat("garbage"); err == nil {
		t.Fatal("parseStat accepted garbage")
	}

	proc := filepath.Join("testdata", "proc")
	sup, ok := findSupervisor(proc, "runsvdir")
	if !ok || sup.pid != 42 || scanDir(sup.args, "/etc/service") != "/etc/service" {
		t.Fatalf("runsvdir: %+v, %v", sup, ok)
	}
	if sup, ok := findSupervisor(proc, "s6-svscan"); ok {
		t.Fatalf("s6-svscan is a grandchild of pid 1 and was taken for the init's: %+v", sup)
	}
	if got := scanDir([]string{"runsvdir"}, "/etc/service"); got != "/etc/service" {
		t.Fatalf("scanDir default = %q", got)
	}
}

// The kernel's own controller family is always registered where generic
// netlink works at all; a made-up one never is.
func TestGenlFamily(t *testing.T) {
	ok, err := genlFamily(t.Context(), "nlctrl")
	if err != nil {
		t.Fatalf("generic netlink unavailable: %v", err)
	}
	if !ok {
		t.Fatal(`genetlink family "nlctrl" not found`)
	}
	if ok, err := genlFamily(t.Context(), "nosuchfamily"); ok || err != nil {
		t.Fatalf("made-up family: %v, %v", ok, err)
	}
}

func TestArchOf(t *testing.T) {
	for _, tc := range [][3]string{
		{"amd64", "x86_64", "amd64"},
		{"arm64", "aarch64", "arm64"},
		{"arm", "aarch64", "arm (kernel aarch64)"},
		{"386", "x86_64", "386 (kernel x86_64)"},
		{"amd64", "", "amd64"},
	} {
		if got := archOf(tc[0], tc[1]); got != tc[2] {
			t.Errorf("archOf(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}
