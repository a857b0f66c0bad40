package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nox-mesh/nox-mesh-host/clock"
)

// DefaultInstalled is where the host's binaries are installed, by name:
// what Healthy copies from and a rollback copies back to.
func DefaultInstalled() map[string]string {
	return map[string]string{
		"mesh-executor": "/usr/bin/mesh-executor",
		"mesh-agent":    "/usr/bin/mesh-agent",
	}
}

// Healthy is for the executor to call when a reconcile has run to its end,
// whatever its outcome: the binaries that did it are good. It copies each
// named binary (name → installed path, e.g. "mesh-executor" →
// os.Executable()) into the known-good directory, atomically and 0755, and
// then clears the start counter and the rolled_back mark in the launch
// state. It never clears a halt (only a person does, with Clear).
//
// The agent proves itself apart (AgentProven): while the installed
// mesh-agent is neither the known-good one nor a binary seen to stay up,
// the known-good copy is left as it is — a release whose executor
// reconciles and whose agent crash-loops is not known good — and the
// counter is still cleared.
//
// Important: if one of the binaries is the calling program's own (same
// path as os.Executable()) and the file installed there is no longer the
// one running — an upgrade installed but not yet started — the known-good
// copy is left as it is, since the new binary has not reconciled yet; the
// counter is still cleared. That is how a declaration that upgrades the
// host does not make the untried release "known good".
//
// It is safe while the launcher runs: it holds the launch state's lock for
// the whole call. A copy that fails leaves the known-good directory as it
// was (every copy is staged before any is renamed) and is returned, after
// the counter is cleared.
func Healthy(stateDir string, binaries map[string]string) error {
	return HealthyPackage(stateDir, binaries, "")
}

// HealthyPackage is Healthy for an executor run from the installed
// package: pkgVersion (the package manager's version of the host's
// package, when the running binaries are the installed ones) is kept with
// the known-good copy, so a rollback can reinstall that release through
// the package manager.
func HealthyPackage(stateDir string, binaries map[string]string, pkgVersion string) error {
	if err := checkDir(stateDir, true); err != nil {
		return err
	}
	unlock, err := lockState(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := ReadState(stateDir)
	if err != nil {
		return err
	}
	kg := s.KnownGoodDir
	if kg == "" {
		kg = filepath.Join(stateDir, KnownGoodDir)
	}
	var sums map[string]string
	var kept bool
	var copyErr error
	if agent, ok := binaries["mesh-agent"]; ok && agentUnproven(s, agent) {
		// The executor reconciled, but the agent beside it has not yet
		// been seen to stay up: the release is not known good yet
		// (AgentProven, then Healthy again, makes it so).
		kept = true
	} else {
		sums, kept, copyErr = keepKnownGood(kg, binaries)
	}
	now := clock.Now().UTC()
	s.Starts, s.HealthyAt = nil, now
	if s.RolledBack != nil && s.RolledBack.Reinstalled {
		// A mark not yet acted on (the agent's crash loop, set while this
		// executor ran) stays for the launcher to finish.
		s.RolledBack = nil
	}
	if copyErr == nil && !kept {
		s.KnownGood = &KnownGood{At: now, Binaries: sums, Package: pkgVersion}
	}
	if err := writeState(stateDir, s); err != nil {
		return errors.Join(copyErr, err)
	}
	return copyErr
}

// validName is a binary's name: one path element, not hidden (the
// temporaries are).
func validName(n string) bool {
	return n != "" && !strings.ContainsAny(n, "/\x00") && !strings.HasPrefix(n, ".")
}

// keepKnownGood copies binaries into kg. kept reports that it copied
// nothing because the caller's own binary was replaced since it started.
func keepKnownGood(kg string, binaries map[string]string) (sums map[string]string, kept bool, err error) {
	if !filepath.IsAbs(kg) {
		return nil, false, fmt.Errorf("launcher: the known-good directory %q is not absolute", kg)
	}
	if err := checkDir(kg, true); err != nil {
		return nil, false, err
	}
	self, _ := os.Executable()
	var running unix.Stat_t
	haveRunning := unix.Stat("/proc/self/exe", &running) == nil
	sums = map[string]string{}
	staged := map[string]string{}
	type toCopy struct {
		f   *os.File
		dst string
	}
	var copies []toCopy
	var need uint64
	defer func() {
		if err != nil || kept {
			for tmp := range staged {
				os.Remove(tmp)
			}
		}
	}()
	for _, name := range sortedNames(binaries) {
		src := binaries[name]
		if !validName(name) {
			return nil, false, fmt.Errorf("launcher: %q is not a binary's name", name)
		}
		f, err := openRegular(src, true)
		if err != nil {
			return nil, false, err
		}
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		if haveRunning && self != "" && samePath(src, self) && (st.Dev != running.Dev || st.Ino != running.Ino) {
			f.Close()
			return nil, true, nil
		}
		sum, err := digest(f)
		if err != nil {
			f.Close()
			return nil, false, err
		}
		sums[name] = sum
		dst := filepath.Join(kg, name)
		if old, err := openRegular(dst, false); err == nil {
			same := false
			if d, err := digest(old); err == nil && d == sum {
				same = true
			}
			old.Close()
			if same {
				f.Close()
				continue
			}
		}
		defer f.Close()
		copies = append(copies, toCopy{f, dst})
		need += uint64(st.Size)
	}
	// Room first: a copy that fills the filesystem fails, is removed, and
	// is tried again at the next reconcile — every program writing there
	// meanwhile told the disk is full, at each.
	var fs unix.Statfs_t
	if len(copies) > 0 && unix.Statfs(kg, &fs) == nil {
		if free := fs.Bavail * uint64(fs.Bsize); free < need+knownGoodReserve {
			return nil, false, fmt.Errorf("launcher: the known-good copy needs %d bytes and %s has %d free (%d kept free for the rest): not copied; free room there, or give the launcher a --known-good directory on another filesystem", need, kg, free, knownGoodReserve)
		}
	}
	for _, c := range copies {
		tmp, err := stage(c.dst, 0o755, func(w *os.File) error {
			if _, err := c.f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			_, err := io.Copy(w, c.f)
			return err
		})
		if err != nil {
			return nil, false, err
		}
		staged[tmp] = c.dst
	}
	if err := commit(staged); err != nil {
		staged = nil
		return nil, false, err
	}
	staged = nil
	return sums, false, nil
}

// knownGoodReserve is what the known-good copy leaves free on its
// filesystem: the state's store and journal share it.
const knownGoodReserve = 16 << 20

// CopyReinstall is the default Config.Reinstall: it copies each binary of
// installed that has a copy in knownGood over its installed path, atomically
// (a temporary in the same directory, renamed), mode 0755. A name without a
// copy is left alone; no copy at all is an error, since then there is
// nothing to roll back to. A symbolic link at the installed path is
// followed, so the file it names is the one replaced. All copies are staged
// before any is renamed.
func CopyReinstall(ctx context.Context, knownGood string, installed map[string]string) (err error) {
	staged := map[string]string{}
	defer func() {
		if err != nil {
			for tmp := range staged {
				os.Remove(tmp)
			}
		}
	}()
	var missing []string
	for _, name := range sortedNames(installed) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !validName(name) {
			return fmt.Errorf("launcher: %q is not a binary's name", name)
		}
		f, err := openRegular(filepath.Join(knownGood, name), false)
		if errors.Is(err, os.ErrNotExist) {
			missing = append(missing, name)
			continue
		}
		if err != nil {
			return err
		}
		dst := installed[name]
		if real, err := filepath.EvalSymlinks(dst); err == nil {
			dst = real
		}
		label, err := securityLabel(dst)
		if err != nil {
			f.Close()
			return err
		}
		tmp, err := stage(dst, 0o755, func(w *os.File) error {
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
			return setSecurityLabel(w, label)
		})
		f.Close()
		if err != nil {
			return err
		}
		staged[tmp] = dst
	}
	if len(staged) == 0 {
		return fmt.Errorf("launcher: no known-good copy of %s in %s: the executor has never reported a reconcile run to its end on this node",
			strings.Join(missing, ", "), knownGood)
	}
	err = commit(staged)
	staged = nil // commit removed what it did not rename
	return err
}

// selinuxLabel is the extended attribute that holds a file's SELinux
// context.
const selinuxLabel = "security.selinux"

// securityLabel reads the SELinux context of the binary a rollback is about
// to replace, so the copy put in its place keeps it: a copy made in the
// launcher's directory would otherwise carry that directory's label, and on
// an enforcing system the executor would no longer enter its own domain.
// Nil when there is none (no SELinux, or a file system without labels).
func securityLabel(p string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, selinuxLabel, buf)
		switch {
		case err == nil:
			return buf[:n], nil
		case err == unix.ERANGE && len(buf) < 64<<10:
			buf = make([]byte, 4*len(buf))
		case err == unix.ENODATA || err == unix.ENOTSUP || err == unix.ENOENT:
			return nil, nil
		default:
			return nil, fmt.Errorf("launcher: read the SELinux label of %s: %w", p, err)
		}
	}
}

// setSecurityLabel gives the staged copy the label the replaced binary had.
// A file system that keeps no labels has nothing to give back; any other
// refusal fails the rollback rather than leave a binary in the wrong domain.
func setSecurityLabel(f *os.File, label []byte) error {
	if label == nil {
		return nil
	}
	if err := unix.Fsetxattr(int(f.Fd()), selinuxLabel, label, 0); err != nil && err != unix.ENOTSUP {
		return fmt.Errorf("set the SELinux label %q: %w", strings.TrimRight(string(label), "\x00"), err)
	}
	return nil
}

func sortedNames(m map[string]string) []string {
	var ns []string
	for n := range m {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// openRegular opens a regular file for reading. follow says whether a
// symbolic link at p may be followed (an installed path may be one; a file
// the launcher keeps never is). A kept file must also be this user's and
// writable by nobody else.
func openRegular(p string, follow bool) (*os.File, error) {
	flags := os.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	f, err := os.OpenFile(p, flags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("launcher: %s is a symbolic link; refused", p)
		}
		return nil, fmt.Errorf("launcher: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("launcher: stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("launcher: %s is not a regular file; refused", p)
	}
	if !follow && (int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0) {
		f.Close()
		return nil, fmt.Errorf("launcher: %s is owned by uid %d with mode %04o; a known-good copy is the launcher's own and writable by nobody else", p, st.Uid, st.Mode&0o7777)
	}
	return f, nil
}

func digest(f *os.File) (string, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("launcher: read %s: %w", f.Name(), err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// samePath tells whether two paths name the same place once links are
// resolved (os.Executable has them resolved already).
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}
