package initsys

import (
	"strings"
	"testing"
)

// Each init's definition of one program: the files, where, and what they
// say — the program, its user, its environment, the host's mark — in the
// init's own terms.
func TestDefine(t *testing.T) {
	p := Program{Name: "app", Exec: []string{"/opt/app/bin/app", "--port", "8080"}, User: "app", Env: [][2]string{{"MODE", "prod"}, {"X", ""}}, Description: "m.app"}
	for _, c := range []struct {
		init, scan, path string
		mode             uint32
		dirs             []string
		has              []string
	}{
		{"systemd", "", "/etc/systemd/system/app.service", 0o644, nil, []string{
			"ExecStart=/opt/app/bin/app --port 8080\n", "User=app\n", "Environment=MODE=prod\n", "Environment=X=\n", "NoNewPrivileges=yes\n", "Restart=always\n", "WantedBy=multi-user.target\n", "# nox-mesh-host process m.app"}},
		{"openrc", "", "/etc/init.d/app", 0o755, nil, []string{
			"#!/sbin/openrc-run\n", "supervisor=supervise-daemon\n", "command=/opt/app/bin/app\n", `command_args="--port 8080"`, `command_user="app"`, `supervise_daemon_args="--env MODE=prod --env X="`}},
		{"runit", "/etc/service", "/etc/sv/app/run", 0o755, []string{"/etc/sv/app"}, []string{
			"exec chpst -u app env MODE=prod X= /opt/app/bin/app --port 8080\n"}},
		{"s6", "/etc/s6/scan", "/etc/s6/scan/app/run", 0o755, []string{"/etc/s6/scan/app"}, []string{
			"exec s6-setuidgid app env MODE=prod X= /opt/app/bin/app --port 8080\n"}},
	} {
		d, err := Define(c.init, c.scan, p)
		if err != nil {
			t.Fatalf("%s: %v", c.init, err)
		}
		if len(d.Files) != 1 || d.Files[0].Path != c.path || d.Files[0].Mode != c.mode || strings.Join(d.Dirs, ",") != strings.Join(c.dirs, ",") {
			t.Errorf("%s: %+v", c.init, d)
			continue
		}
		for _, want := range c.has {
			if !strings.Contains(d.Files[0].Content, want) {
				t.Errorf("%s: the definition lacks %q:\n%s", c.init, want, d.Files[0].Content)
			}
		}
		if got := d.Paths(); got[0] != c.path || len(got) != 1+len(c.dirs) {
			t.Errorf("%s: paths %v", c.init, got)
		}
	}
	if _, err := Define("s6", "", p); err == nil {
		t.Error("s6 without a scan directory")
	}
	if _, err := Define("upstart", "", p); err == nil {
		t.Error("an init the host does not know")
	}
}
