package rescue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The attacker is this test binary run again as uid/gid 65534 (nobody),
// with the operations to carry out in an environment variable. It acts only
// through the system calls an unprivileged user has.

const attackerEnv = "RESCUE_ATTACKER_OPS"

const attackerUID, attackerGID = 65534, 65534

// op is one thing the attacker does.
type op struct {
	Op      string `json:"op"`
	Path    string `json:"path,omitempty"`
	Target  string `json:"target,omitempty"` // symlink and hardlink target, rename destination
	Content string `json:"content,omitempty"`
	// For "swap": how long to keep swapping.
	Millis int `json:"millis,omitempty"`
}

func symlinkOp(target, link string) op { return op{Op: "symlink", Target: target, Path: link} }
func renameOp(from, to string) op      { return op{Op: "rename", Path: from, Target: to} }
func removeOp(p string) op             { return op{Op: "remove", Path: p} }
func mkfifoOp(p string) op             { return op{Op: "mkfifo", Path: p} }
func hardlinkOp(target, p string) op   { return op{Op: "hardlink", Target: target, Path: p} }
func writeOp(p, content string) op     { return op{Op: "write", Path: p, Content: content} }
func mkdirOp(p string) op              { return op{Op: "mkdir", Path: p} }
func deniedOp(p string) op             { return op{Op: "expect-denied", Path: p} }

// swapOp swaps the directory p for a symlink to target and back, as fast as
// it can, for d; it always leaves the real directory in place at the end.
func swapOp(p, target string, d time.Duration) op {
	return op{Op: "swap", Path: p, Target: target, Millis: int(d / time.Millisecond)}
}

// attackerMain runs in the child process.
func attackerMain(opsJSON string) int {
	if os.Geteuid() != attackerUID || os.Getegid() != attackerGID {
		fmt.Fprintf(os.Stderr, "attacker: running as %d:%d, not %d:%d\n", os.Geteuid(), os.Getegid(), attackerUID, attackerGID)
		return 3
	}
	if g, _ := os.Getgroups(); len(g) > 0 {
		fmt.Fprintf(os.Stderr, "attacker: still in groups %v\n", g)
		return 3
	}
	var ops []op
	if err := json.Unmarshal([]byte(opsJSON), &ops); err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		return 3
	}
	for _, o := range ops {
		if err := o.do(); err != nil {
			fmt.Fprintf(os.Stderr, "attacker: %s %s: %v\n", o.Op, o.Path, err)
			return 1
		}
	}
	return 0
}

func (o op) do() error {
	switch o.Op {
	case "symlink":
		return os.Symlink(o.Target, o.Path)
	case "rename":
		return os.Rename(o.Path, o.Target)
	case "remove":
		return os.Remove(o.Path)
	case "mkfifo":
		return syscall.Mkfifo(o.Path, 0o644)
	case "hardlink":
		return os.Link(o.Target, o.Path)
	case "write":
		return os.WriteFile(o.Path, []byte(o.Content), 0o644)
	case "mkdir":
		return os.Mkdir(o.Path, 0o755)
	case "expect-denied":
		f, err := os.OpenFile(o.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			f.Close()
			os.Remove(o.Path)
			return errors.New("an unprivileged user could create this: the test's setup is wrong")
		}
		if !errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("expected permission denied, got %v", err)
		}
		return nil
	case "swap":
		return swap(o.Path, o.Target, time.Duration(o.Millis)*time.Millisecond)
	}
	return fmt.Errorf("unknown op %q", o.Op)
}

// swap is the race of case g: the directory the apply writes into is renamed
// away and a symlink to target put in its place, then put back, in a loop.
func swap(dir, target string, d time.Duration) error {
	away := dir + ".away"
	deadline := time.Now().Add(d)
	n := 0
	rng := rand.New(rand.NewSource(int64(os.Getpid())))
	for time.Now().Before(deadline) {
		if err := os.Rename(dir, away); err != nil {
			return err
		}
		if err := os.Symlink(target, dir); err != nil {
			return err
		}
		// The link stays a short while, the directory a random while
		// longer: some applies then get past observing every file and
		// meet the link while they write.
		spin(time.Duration(rng.Int63n(int64(2 * time.Millisecond))))
		if err := os.Remove(dir); err != nil {
			return err
		}
		if err := os.Rename(away, dir); err != nil {
			return err
		}
		spin(time.Duration(rng.Int63n(int64(20 * time.Millisecond))))
		n++
	}
	fmt.Printf("%d swaps\n", n)
	return nil
}

// spin waits d without sleeping, so the swap keeps its core.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

// attackerCmd is the attacker process, not started.
func attackerCmd(ctx context.Context, t testing.TB, ops ...op) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	data, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, attackerBin)
	cmd.Env = []string{attackerEnv + "=" + string(data), "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: attackerUID, Gid: attackerGID}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

// attack runs the attacker's operations as uid 65534 and fails the test if
// any of them fails.
func attack(t testing.TB, ops ...op) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := attackerCmd(ctx, t, ops...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("the attacker (uid %d) failed: %v: %s", attackerUID, err, strings.TrimSpace(out.String()))
	}
}
