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
	"strings"
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
	leaveNote(t, dir, leftProgram{PID: cmd.Process.Pid, Start: start, Boot: bootID(), Argv: cmd.Args, Deadline: deadline})
}

func leaveNote(t *testing.T, dir string, l leftProgram) string {
	t.Helper()
	os.MkdirAll(dir, 0o700)
	b, _ := json.Marshal(l)
	p := filepath.Join(dir, strconv.Itoa(l.PID))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// leaderGone starts a group whose leader forks sleep and exits: what is
// left is the child, in the leader's group.
func leaderGone(t *testing.T) (pid int, start uint64) {
	t.Helper()
	cmd := startGroup(t, "/bin/sh", "-c", "sleep 60 & echo $!; exit 0")
	start, _ = procStart(cmd.Process.Pid)
	waitUntil(t, "the leader exited, its child left", func() bool {
		return !alive(cmd.Process.Pid) && len(groupOf(leftProgram{PID: cmd.Process.Pid, Start: start})) == 1
	})
	return cmd.Process.Pid, start
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for range 500 {
		if ok() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within 5s", what)
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
	t.Run("a note of another boot", func(t *testing.T) {
		// Its pids and start times are that boot's: a group of this one
		// at the same pid is another's, and is left alone.
		dir := t.TempDir()
		pid, start := leaderGone(t)
		leaveNote(t, dir, leftProgram{PID: pid, Start: start, Boot: "another-boot", Deadline: time.Now().Add(-time.Hour)})
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if len(groupOf(leftProgram{PID: pid, Start: start})) != 1 {
			t.Fatal("a group of this boot was killed for a note of another")
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("the note was kept: %v", ents)
		}
		// A note without a boot id (the first release's), written before
		// this boot began, the same.
		p := leaveNote(t, dir, leftProgram{PID: pid, Start: start, Deadline: time.Now().Add(-time.Hour)})
		booted, ok := bootTime()
		if !ok {
			t.Fatal("no btime in /proc/stat")
		}
		os.Chtimes(p, booted.Add(-time.Minute), booted.Add(-time.Minute))
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if len(groupOf(leftProgram{PID: pid, Start: start})) != 1 {
			t.Fatal("a group of this boot was killed for a note written before it")
		}
		// Written in this boot, the group is the program's.
		leaveNote(t, dir, leftProgram{PID: pid, Start: start, Deadline: time.Now().Add(-time.Hour)})
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if g := groupOf(leftProgram{PID: pid, Start: start}); len(g) != 0 {
			t.Fatalf("a note of this boot past its deadline left its group: %v", g)
		}
	})
	t.Run("an action's leftovers go once it has exited", func(t *testing.T) {
		// As Action takes away what an action left in its group when it
		// ends: before its deadline.
		dir := t.TempDir()
		pid, start := leaderGone(t)
		leaveNote(t, dir, leftProgram{PID: pid, Start: start, Boot: bootID(), Stop: stopAction, Deadline: time.Now().Add(time.Hour)})
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if g := groupOf(leftProgram{PID: pid, Start: start}); len(g) != 0 {
			t.Fatalf("what the action left was not taken away: %v", g)
		}
	})
	t.Run("a package manager is stopped alone at its deadline", func(t *testing.T) {
		// As Run stops a Gentle program: SIGTERM to it, never to its
		// group, so what it runs (dpkg) finishes; once it is gone the
		// wait ends, its child still running.
		dir := t.TempDir()
		cmd := startGroup(t, "/bin/sh", "-c", "sleep 60 & wait")
		start, _ := procStart(cmd.Process.Pid)
		waitUntil(t, "the shell started its child", func() bool { return len(groupOf(leftProgram{PID: cmd.Process.Pid, Start: start})) == 2 })
		l := leftProgram{PID: cmd.Process.Pid, Start: start, Boot: bootID(), Stop: stopGentle, Deadline: time.Now().Add(200 * time.Millisecond)}
		leaveNote(t, dir, l)
		if err := LeftRunning(dir, nil, say); err != nil {
			t.Fatal(err)
		}
		if g := groupOf(l); len(g) != 1 || g[0] == cmd.Process.Pid {
			t.Fatalf("the group after a package manager's stop: %v; want its child alone", g)
		}
	})
	t.Run("a group no kill ends", func(t *testing.T) {
		// A process in the kernel's uninterruptible sleep outlives
		// SIGKILL: the wait gives up, naming it, and a stop ends it.
		defer func(o time.Duration) { outlivesKill = o }(outlivesKill)
		defer func(o func(int, syscall.Signal) error) { signal = o }(signal)
		signal = func(int, syscall.Signal) error { return nil }
		outlivesKill = 300 * time.Millisecond
		dir := t.TempDir()
		cmd := startGroup(t, "/bin/sleep", "60")
		start, _ := procStart(cmd.Process.Pid)
		leave(t, dir, cmd, start, time.Now())
		said0 := len(said)
		err := LeftRunning(dir, nil, say)
		if err == nil || !strings.Contains(err.Error(), "did not end when stopped at its deadline") || !strings.Contains(err.Error(), "in state S") {
			t.Fatalf("%v", err)
		}
		if n := len(said) - said0; n != 2 {
			t.Fatalf("said %d times: %q; want the wait and the kill once each", n, said[said0:])
		}
		// What an action left, its leader gone, no kill ends either.
		pid, start := leaderGone(t)
		left := t.TempDir()
		leaveNote(t, left, leftProgram{PID: pid, Start: start, Boot: bootID(), Stop: stopAction, Deadline: time.Now().Add(time.Hour)})
		if err := LeftRunning(left, nil, say); err == nil || !strings.Contains(err.Error(), "did not end when stopped") {
			t.Fatalf("an action's leftovers no kill ends: %v", err)
		}
		outlivesKill = time.Hour
		stop := make(chan struct{})
		time.AfterFunc(200*time.Millisecond, func() { close(stop) })
		if err := LeftRunning(dir, stop, say); !errors.Is(err, ErrStopped) {
			t.Fatalf("a stop did not end the wait past the deadline: %v", err)
		}
	})
	t.Run("noted while it runs", func(t *testing.T) {
		dir := t.TempDir()
		ctx := Tracked(context.Background(), dir)
		seen := make(chan leftProgram, 1)
		go func() {
			for range 100 {
				if ents, _ := os.ReadDir(dir); len(ents) == 1 {
					l, _ := readNote(filepath.Join(dir, ents[0].Name()))
					seen <- l
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			seen <- leftProgram{}
		}()
		if code, _, err := Action(ctx, []string{"/bin/sleep", "0.5"}, time.Minute); err != nil || code != 0 {
			t.Fatal(code, err)
		}
		if l := <-seen; l.PID == 0 || l.Boot != bootID() || l.Boot == "" || l.Stop != stopAction {
			t.Fatalf("the note while the action ran: %+v", l)
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
		// The boot and how the executor stops it (a package manager).
		"1057ef4": {Format: 1, PID: 4242, Start: 123457, Boot: "5e1fc3a2-7f0c-4a59-9a3e-2b8f6f7d0c11", Stop: stopGentle, Argv: []string{"/usr/bin/apt-get", "install", "-y", "nginx"}, Deadline: time.Date(2026, 12, 7, 23, 30, 0, 0, time.UTC)},
	}
	golden.Each(t, goldens, func(t *testing.T, release string, want leftProgram) {
		got, ok := readNote(golden.Path(release, "4242"))
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("read %+v %v; want %+v", got, ok, want)
		}
	})
}
