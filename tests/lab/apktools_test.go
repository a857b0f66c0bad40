package lab

import (
	"debug/elf"
	"os/exec"
	"strings"
	"testing"
)

// The apk the Alpine labs run is the vendored apk-tools, built static: it
// says its version, and it has no interpreter and needs no shared library,
// so a lab's overlay of the host cannot lend it a different libc or
// OpenSSL than the build linked.
func TestAPKToolsIsStatic(t *testing.T) {
	apk := APKTools(t)
	out, err := exec.Command(apk, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "apk-tools 3.0.6") {
		t.Fatalf("%s --version: %v %q", apk, err, out)
	}
	f, err := elf.Open(apk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an interpreter: not static", apk)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("%s needs %v", apk, libs)
	}
}
