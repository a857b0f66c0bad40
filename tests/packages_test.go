package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// packageVersion is the version the package targets are given here: what
// the packages' names and the binaries' stamps must say.
const packageVersion = "1.2.3"

// hostFiles are the files every package of the host carries (the
// directories between them aside), with the mode each must have: the
// binaries, the carried bundle, the documents, the man pages and the
// completions of the four programs (packaging/nfpm.yaml, tarball.sh).
// zsh is the zsh completions' directory, which Debian's zsh names its own
// way.
func hostFiles(zsh string) map[string]string {
	files := map[string]string{
		"usr/lib/nox-mesh-host/foundation.lock": "-rw-r--r--",
		"usr/share/man/man1/mesh-control.1":     "-rw-r--r--",
	}
	for _, d := range []string{"docs/operations.md", "docs/declaration.md", "SECURITY.md"} {
		files["usr/share/doc/nox-mesh-host/"+filepath.Base(d)] = "-rw-r--r--"
	}
	for _, p := range []string{"mesh-executor", "mesh-agent", "mesh-launch", "mesh-control"} {
		files["usr/bin/"+p] = "-rwxr-xr-x"
		files["usr/share/bash-completion/completions/"+p] = "-rw-r--r--"
		files[zsh+"/_"+p] = "-rw-r--r--"
		files["usr/share/fish/vendor_completions.d/"+p+".fish"] = "-rw-r--r--"
		if p != "mesh-control" {
			files["usr/share/man/man8/"+p+".8"] = "-rw-r--r--"
		}
	}
	return files
}

// systemd are the files of a package for systemd: the units, the agent's
// user and the state directories.
var systemd = map[string]string{
	"usr/lib/systemd/system/mesh-executor.service": "-rw-r--r--",
	"usr/lib/systemd/system/mesh-agent.service":    "-rw-r--r--",
	"usr/lib/systemd/system/mesh-control.service":  "-rw-r--r--",
	"usr/lib/sysusers.d/nox-mesh-host.conf":        "-rw-r--r--",
	"usr/lib/tmpfiles.d/nox-mesh-host.conf":        "-rw-r--r--",
}

func union(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// make deb, make apk, make arch and make tarball each put one system's
// package into dist/, and say its path and nothing else (make package's
// quiet, which V=1 makes talk); each package holds exactly the host's
// files at the paths that system looks in, with their modes, and the
// binaries say the version they were given.
func TestPackageTargets(t *testing.T) {
	for _, tool := range []string{"make", "dpkg-deb", "tar", "zstd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to build and list the packages (tests/install-deps.sh installs it): %v", tool, err)
		}
	}
	dist := t.TempDir()
	mk := exec.Command("make", "--no-print-directory", "deb", "apk", "arch", "tarball", "DIST="+dist, "PKG_VERSION="+packageVersion)
	mk.Dir = ".."
	var stderr strings.Builder
	mk.Stderr = &stderr
	out, err := mk.Output()
	if err != nil {
		t.Fatalf("make: %v\n%s%s", err, out, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("make said on standard error:\n%s", stderr.String())
	}
	made := map[string]string{
		"deb":     filepath.Join(dist, "nox-mesh-host_"+packageVersion+"-1_amd64.deb"),
		"apk":     filepath.Join(dist, "nox-mesh-host_"+packageVersion+"-r1_x86_64.apk"),
		"arch":    filepath.Join(dist, "nox-mesh-host-"+packageVersion+"-1-x86_64.pkg.tar.zst"),
		"tarball": filepath.Join(dist, "nox-mesh-host-"+packageVersion+"-linux-amd64.tar.gz"),
	}
	if want := strings.Join([]string{made["deb"], made["apk"], made["arch"], made["tarball"]}, "\n") + "\n"; string(out) != want {
		t.Errorf("make said\n%s\nwant the packages' paths alone:\n%s", out, want)
	}
	for _, c := range []struct {
		target string
		list   []string // the command that lists the package, its file last
		files  map[string]string
	}{
		{"deb", []string{"dpkg-deb", "-c"}, union(hostFiles("usr/share/zsh/vendor-completions"), systemd)},
		// An .apk is gzip members one after the other (control, data):
		// tar reads past the first's end with -i.
		{"apk", []string{"tar", "-tvizf"}, union(hostFiles("usr/share/zsh/site-functions"), map[string]string{
			"etc/init.d/mesh-executor": "-rwxr-xr-x",
			"etc/init.d/mesh-agent":    "-rwxr-xr-x",
			"etc/init.d/mesh-control":  "-rwxr-xr-x",
		})},
		{"arch", []string{"tar", "--zstd", "-tvf"}, union(hostFiles("usr/share/zsh/site-functions"), systemd)},
		{"tarball", []string{"tar", "-tvzf"}, union(hostFiles("usr/share/zsh/site-functions"), systemd, map[string]string{
			"usr/share/nox-mesh-host/init/openrc/mesh-executor": "-rwxr-xr-x",
			"usr/share/nox-mesh-host/init/openrc/mesh-agent":    "-rwxr-xr-x",
			"usr/share/nox-mesh-host/init/openrc/mesh-control":  "-rwxr-xr-x",
		})},
	} {
		t.Run(c.target, func(t *testing.T) {
			list := exec.Command(c.list[0], append(c.list[1:], made[c.target])...)
			listed, err := list.Output()
			if err != nil {
				t.Fatalf("%s: %v", strings.Join(list.Args, " "), err)
			}
			got := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(string(listed)), "\n") {
				f := strings.Fields(l)
				if len(f) < 6 || strings.HasPrefix(f[0], "d") {
					continue
				}
				name := strings.TrimPrefix(f[len(f)-1], "./")
				if !strings.Contains(name, "/") && strings.HasPrefix(name, ".") {
					continue // the packager's own: .PKGINFO, .MTREE, scripts
				}
				got[name] = f[0]
			}
			for name, mode := range c.files {
				switch have, ok := got[name]; {
				case !ok:
					t.Errorf("%s has no %s", filepath.Base(made[c.target]), name)
				case have != mode:
					t.Errorf("%s: %s is %s, want %s", filepath.Base(made[c.target]), name, have, mode)
				}
			}
			for name := range got {
				// The tarball carries the other inits' files beyond those
				// named above (runit's and s6's directories).
				if _, ok := c.files[name]; !ok && !(c.target == "tarball" && strings.HasPrefix(name, "usr/share/nox-mesh-host/init/")) {
					t.Errorf("%s carries %s, which no package is to", filepath.Base(made[c.target]), name)
				}
			}
		})
	}
	// The binaries say the version they were packaged as, and the man
	// pages and completions are theirs: from the tarball, as a machine
	// without a package manager unpacks it.
	root := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", made["tarball"], "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	for _, p := range []string{"mesh-executor", "mesh-agent", "mesh-launch", "mesh-control"} {
		v, err := exec.Command(filepath.Join(root, "usr/bin", p), "--version").Output()
		if err != nil || !strings.HasPrefix(string(v), p+" "+packageVersion+" ") {
			t.Errorf("%s --version: %q %v", p, v, err)
		}
		comp, err := os.ReadFile(filepath.Join(root, "usr/share/bash-completion/completions", p))
		if err != nil || !strings.Contains(string(comp), "complete ") || !strings.Contains(string(comp), p) {
			t.Errorf("%s's bash completion: %v\n%s", p, err, comp)
		}
	}
	man, _ := os.ReadFile(filepath.Join(root, "usr/share/man/man8/mesh-executor.8"))
	if !slices.ContainsFunc(strings.Split(string(man), "\n"), func(l string) bool {
		return strings.HasPrefix(l, ".TH MESH-EXECUTOR 8") && strings.Contains(l, packageVersion)
	}) {
		t.Errorf("mesh-executor.8 is not its manual of %s:\n%.300s", packageVersion, man)
	}
}
