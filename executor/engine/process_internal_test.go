package engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process declared with a script as its program runs as the kernel
// starts a script — its interpreter (with the interpreter's argument, if
// the "#!" line names one), then the script's path and the declared
// arguments — and is found so; a program that is no script is found by
// its own command line alone.
func TestAScriptDeclaredIsFoundRunning(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, head string }{
		{"plain", "#!/bin/sh\n"},
		{"with an argument", "#! /bin/sh -e\n"},
		{"blanks around", "#!\t/bin/sh  -e  \n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			os.WriteFile(script, []byte(tc.head+"sleep 30\n"), 0o755)
			cmd := exec.Command(script, "one", "two")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
			want := cmdlinesOf([]string{script, "one", "two"})
			if len(want) != 2 {
				t.Fatalf("the command lines of a script: %q", want)
			}
			for until := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				found, err := findProcess(want...)
				if err != nil {
					t.Fatal(err)
				}
				if len(found) == 1 && found[0] == [2]int{0, 0} {
					break
				}
				if time.Now().After(until) {
					b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
					t.Fatalf("not found: %q; it runs as %q", want, b)
				}
			}
		})
	}
	if got := cmdlinesOf([]string{"/bin/sleep", "30"}); len(got) != 1 || string(got[0]) != "/bin/sleep\x0030\x00" {
		t.Fatalf("a program that is no script: %q", got)
	}
}

// The program's head is read as root from a path its user may write: a
// FIFO there is not opened (it would hold the apply for good), nor a link
// followed (to a device, say); the declared command line alone is looked
// for.
func TestAProgramsHeadIsNeverReadThroughAFIFOOrALink(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink("/dev/zero", link)
	for _, p := range []string{fifo, link} {
		done := make(chan [][]byte, 1)
		go func() { done <- cmdlinesOf([]string{p}) }()
		select {
		case got := <-done:
			if len(got) != 1 {
				t.Fatalf("%s: %q", p, got)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the read of its head blocks", p)
		}
	}
}
