package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// The agent's account and state directory, as the packages make them.
const (
	DefaultAgentUser  = "mesh-agent"
	DefaultAgentState = "/var/lib/mesh-host/agent"
)

// EnsureAgentUser makes the agent's system user and group, and its state
// directory (the agent's, 0700), when they are missing: a package makes
// them in its postinstall, a tarball install has no postinstall, and the
// executor refuses to serve without the agent's user. It is the one thing
// besides starting, counting and rolling back that the launcher does, and
// it does it before the first start only. The tools are the machine's own:
// useradd (shadow), else busybox's addgroup/adduser.
func EnsureAgentUser(ctx context.Context, name, home string) (made bool, err error) {
	if _, err := user.Lookup(name); err != nil {
		if err := makeUser(ctx, name, home); err != nil {
			return false, err
		}
		made = true
	}
	u, err := user.Lookup(name)
	if err != nil {
		return made, fmt.Errorf("the agent's user %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return made, agentStateDir(home, uid, gid)
}

func makeUser(ctx context.Context, name, home string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run := func(argv ...string) error {
		res, err := command.Run(ctx, argv, command.Options{})
		if err == nil && res.Code != 0 {
			err = fmt.Errorf("exit status %d", res.Code)
		}
		if err != nil {
			return fmt.Errorf("%v: %v: %s", argv, err, strings.TrimSpace(res.Stdout+"\n"+res.Stderr))
		}
		return nil
	}
	if _, err := command.LookPath("useradd"); err == nil {
		return run("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", home, "--shell", "/usr/sbin/nologin", name)
	}
	if _, err := command.LookPath("adduser"); err == nil {
		if err := run("addgroup", "-S", name); err != nil {
			return err
		}
		return run("adduser", "-S", "-D", "-H", "-h", home, "-s", "/sbin/nologin", "-G", name, name)
	}
	return errors.New("neither useradd nor busybox adduser is on this machine; make the agent's user by hand")
}

// agentStateDir makes home the agent's private directory, or checks that it
// is one: a real directory (not a link), owned by the agent, 0700.
func agentStateDir(home string, uid, gid int) error {
	fi, err := os.Lstat(home)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(home, 0o700); err != nil {
			return err
		}
		if err := os.Chown(home, uid, gid); err != nil {
			return err
		}
		return os.Chmod(home, 0o700)
	}
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || st == nil {
		return fmt.Errorf("the agent's state %s is not a directory (%v); not touched", home, fi.Mode())
	}
	if int(st.Uid) != uid || fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("the agent's state %s is uid %d mode %04o, not the agent's (uid %d) 0700; not touched", home, st.Uid, fi.Mode().Perm(), uid)
	}
	return nil
}
