package command

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/tests/golden"
)

// startGroup starts argv in a process group of its own, as Run and Action
// do, reaped in the background (the dead executor's child, as init would
// reap it).
func startGroup(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd
}

// leave writes the note a killed executor would have left of cmd's group.
func leave(t *testing.T, dir string, cmd *exec.Cmd, start uint64, deadline time.Time) {
	t.Helper()
	os.MkdirAll(dir, 0o700)
	b, _ := json.Marshal(leftProgram{PID: cmd.Process.Pid, Start: start, Argv: cmd.Args, Deadline: deadline})
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(cmd.Process.Pid)), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func alive(pid int) bool {
	f, err := procStat(pid)
	return err == nil && f[0] != "Z"
}

// A program a killed executor left running is waited for until its group
// has ended — the program and what it started, after the program itself
// exited — and killed whole at its deadline; a note whose pid is another
// process now is passed over, that process untouched; a note cut short is
// dropped; a stop ends the wait with the notes kept.
func TestLeftRunning(t *testing.T) {
	var said []string
	say := func(msg string, _ ...any) { said = append(said, msg) }

	t.Run("waited for, children included", func(t *testing.T) {
		dir, said0 := t.TempDir(), len(said)
		tmp := t.TempDir()
		marker, gate := filepath.Join(tmp, "marker"), filepath.Join(tmp, "go")
		// The program's child ends only once the test lets it: what is
		// waited for runs when it is looked at, however slow the machine.
		cmd := startGroup(t, "/bin/sh", "-c", "(while [ ! -e "+gate+" ]; do sleep 0.05; done; sleep 0.2; echo done > "+marker+") & exit 0")
		start, _ := procStart(cmd.Process.Pid)
		leave(t, dir, cmd, start, time.Now().Add(time.Minute))
		ended := make(chan error, 1)
		go func() { ended <- LeftRunning(dir, nil, say) }()
		select {
		case err := <-ended:
			t.Fatalf("returned while the group runs: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		os.WriteFile(gate, nil, 0o600)
		if err := <-ended; err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(marker); err != nil || string(b) != "done\n" {
			t.Fatalf("returned before the group ended: %q %v", b, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 || len(said) != said0+1 {
			t.Fatalf("notes left %v; said %q", ents, said[said0:])
		}
	})
	t.Run("killed at its deadline", func(t *testing.T) {
		dir := t.TempDir()
		cmd := startGroup(t, "/bin/sh", "-c", "sleep 60 & sleep 60")
		time.Sleep(100 * time.Millisecond) // the shell has started its two
		start, _ := procStart(cmd.Process.Pid)
		leave(t, dir, cmd, start, time.Now().Add(300*time.Millisecond))
		l := leftProgram{PID: cmd.Process.Pid, Start: start}
		if n := len(groupOf(l)); n != 3 {
			t.Fatalf("the group has %d processes, want 3", n)
		}
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if g := groupOf(l); len(g) != 0 {
			t.Fatalf("left alive past its deadline: %v", g)
		}
	})
	t.Run("a pid that is another process now", func(t *testing.T) {
		dir := t.TempDir()
		cmd := startGroup(t, "/bin/sleep", "60")
		start, _ := procStart(cmd.Process.Pid)
		leave(t, dir, cmd, start+1, time.Now()) // the note's process started at another time
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if !alive(cmd.Process.Pid) {
			t.Fatal("another process, at a pid a note names, was killed")
		}
	})
	t.Run("a note cut short", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "123"), []byte(`{"pid":12`), 0o600)
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("%v", ents)
		}
	})
	t.Run("a stop ends the wait", func(t *testing.T) {
		dir := t.TempDir()
		cmd := startGroup(t, "/bin/sleep", "60")
		start, _ := procStart(cmd.Process.Pid)
		leave(t, dir, cmd, start, time.Now().Add(time.Minute))
		stop := make(chan struct{})
		time.AfterFunc(200*time.Millisecond, func() { close(stop) })
		if err := LeftRunning(dir, stop, say); !errors.Is(err, ErrStopped) {
			t.Fatal(err)
		}
		if !alive(cmd.Process.Pid) {
			t.Fatal("a stop killed what it waited for")
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("the note was not kept for the next: %v", ents)
		}
	})
	t.Run("noted while it runs", func(t *testing.T) {
		dir := t.TempDir()
		ctx := Tracked(context.Background(), dir)
		seen := make(chan int, 1)
		go func() {
			for range 100 {
				if ents, _ := os.ReadDir(dir); len(ents) == 1 {
					seen <- 1
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			seen <- 0
		}()
		if code, _, err := Action(ctx, []string{"/bin/sleep", "0.5"}, time.Minute); err != nil || code != 0 {
			t.Fatal(code, err)
		}
		if <-seen != 1 {
			t.Fatal("no note while the action ran")
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("a note outlived its action: %v", ents)
		}
	})
}

// Every note of a program running that a release wrote is read.
func TestEveryRunningNoteFormatThatShippedIsRead(t *testing.T) {
	goldens := map[string]leftProgram{
		"050dae3": {Format: 1, PID: 4242, Start: 123456, Argv: []string{"/usr/bin/apt-get", "install", "-y", "nginx"}, Deadline: time.Date(2026, 12, 7, 20, 30, 0, 0, time.UTC)},
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want leftProgram) {
		got, ok := readNote(golden.Path(release, "4242"))
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("read %+v %v; want %+v", got, ok, want)
		}
	})
}
