package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The busybox the Alpine labs run makes a system user and its group as
// Alpine's does: adduser -S into the system range (100-999), addgroup -S
// likewise, writing /etc/passwd, /etc/group and /etc/shadow under the
// root it is run in, and deluser takes them out again.
func TestBusyboxAlpineMakesSystemUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("chroot needs root (make test runs as root)")
	}
	bb := BusyboxAlpine(t)
	root := t.TempDir()
	for _, d := range []string{"bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, c := range map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"group":  "root:x:0:\n",
		"shadow": "root:*:19000:0:99999:7:::\n",
	} {
		if err := os.WriteFile(filepath.Join(root, "etc", f), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sh := func(script string) string {
		t.Helper()
		out, err := exec.Command("chroot", root, "/bin/busybox", "sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	sh("busybox addgroup -S lp-agent && busybox adduser -S -D -H -h /var/lib/lp -s /sbin/nologin -G lp-agent -g 'lp agent' lp-agent")
	pw := strings.Split(sh("busybox grep ^lp-agent: /etc/passwd"), ":")
	gr := strings.Split(sh("busybox grep ^lp-agent: /etc/group"), ":")
	if len(pw) != 7 || len(gr) != 4 || pw[2] < "100" || len(pw[2]) != 3 || pw[3] != gr[2] || pw[4] != "lp agent" || pw[5] != "/var/lib/lp" || pw[6] != "/sbin/nologin" {
		t.Fatalf("adduser -S made %q, addgroup -S %q", pw, gr)
	}
	if got := sh("busybox grep -c ^lp-agent: /etc/shadow"); got != "1" {
		t.Fatalf("/etc/shadow holds lp-agent %s times", got)
	}
	sh("busybox deluser lp-agent")
	if got := sh("busybox grep -c lp-agent /etc/passwd /etc/group || true"); got != "/etc/passwd:0\n/etc/group:0" {
		t.Fatalf("after deluser: %q", got)
	}
}
