package lab

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Alpine's package manager for the labs. No Alpine package or image is
// reachable from here, and Debian ships no apk, so the tests build the real
// one from the source vendored beside the repository (its README says where
// it comes from and why): apk-tools 3.0.6, linked statically so that what
// runs in a lab depends on no library of the host's but the kernel.

const (
	// APKToolsTarball is the vendored source's file name.
	APKToolsTarball = "apk-tools-3.0.6.tar.gz"
	// APKToolsSourceEnv names a directory holding APKToolsTarball and its
	// SHA256SUMS, where the repository's ../shared/vendor/ does not.
	APKToolsSourceEnv = "MESH_APK_TOOLS_SRC"
	// apkCacheRoot keeps the build between test runs: it is about 30 s on
	// two cores, and every Alpine test needs it.
	apkCacheRoot = "/var/cache/nox-mesh-test"
)

// apkSetup is the build's configuration. What a lab needs of apk is its
// commands, signing and verifying, zstd and gzip; Lua, the help text,
// the man pages and the Python binding are left out (the first two need
// Lua, the last two scdoc and Python's headers, none of which the tests
// install). Part of the cache key, so a change rebuilds.
var apkSetup = []string{
	"-Dlua=disabled", "-Dhelp=disabled", "-Ddocs=disabled", "-Dpython=disabled", "-Dtests=disabled",
	"-Ddefault_library=static", "-Dprefer_static=true", "-Dc_link_args=-static",
}

var (
	apkOnce sync.Once
	apkPath string
	apkErr  error
	apkSkip string
)

// APKTools returns the path of a static apk built from the vendored
// apk-tools source, building it once per cache key (the tarball's SHA-256
// and the build's configuration) under /var/cache/nox-mesh-test and once
// per process. The test is skipped, saying why, only when the vendored
// source is absent; a tarball whose digest is not the one SHA256SUMS says,
// or a build that fails (install-deps.sh installs meson, ninja and the
// libraries), fails it.
func APKTools(t testing.TB) string {
	t.Helper()
	apkOnce.Do(func() { apkPath, apkSkip, apkErr = buildAPKTools() })
	if apkSkip != "" {
		t.Skip(apkSkip)
	}
	if apkErr != nil {
		t.Fatal(apkErr)
	}
	return apkPath
}

// apkToolsSource finds the vendored tarball: in $MESH_APK_TOOLS_SRC when
// set, else in ../shared/vendor/ from the repository's root (where CI keeps
// it). It returns "" when neither holds it.
func apkToolsSource() (string, error) {
	if dir := os.Getenv(APKToolsSourceEnv); dir != "" {
		p := filepath.Join(dir, APKToolsTarball)
		if _, err := os.Stat(p); err != nil {
			return "", nil
		}
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("lab: no go.mod above the working directory: cannot find the repository's root")
		}
		dir = up
	}
	p := filepath.Join(dir, "..", "shared", "vendor", APKToolsTarball)
	if _, err := os.Stat(p); err != nil {
		return "", nil
	}
	return p, nil
}

// checkSum verifies tarball against the SHA256SUMS beside it and returns
// its digest.
func checkSum(tarball string) (string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	got := hex.EncodeToString(h.Sum(nil))
	sums := filepath.Join(filepath.Dir(tarball), "SHA256SUMS")
	sf, err := os.Open(sums)
	if err != nil {
		return "", fmt.Errorf("lab: %s has no SHA256SUMS beside it to check it against: %w", tarball, err)
	}
	defer sf.Close()
	sc := bufio.NewScanner(sf)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == filepath.Base(tarball) {
			if f[0] != got {
				return "", fmt.Errorf("lab: %s has sha256 %s, SHA256SUMS says %s: not the vendored source", tarball, got, f[0])
			}
			return got, nil
		}
	}
	return "", fmt.Errorf("lab: %s does not list %s", sums, filepath.Base(tarball))
}

func buildAPKTools() (path, skip string, err error) {
	src, err := apkToolsSource()
	if err != nil {
		return "", "", err
	}
	if src == "" {
		return "", fmt.Sprintf("the vendored apk-tools source (%s) is in neither ../shared/vendor/ from the repository's root nor $%s: no apk to run Alpine's package manager with", APKToolsTarball, APKToolsSourceEnv), nil
	}
	sum, err := checkSum(src)
	if err != nil {
		return "", "", err
	}
	key := sha256.Sum256([]byte(sum + "\n" + strings.Join(apkSetup, "\n")))
	dir := filepath.Join(apkCacheRoot, "apk-tools-"+hex.EncodeToString(key[:8]))
	bin := filepath.Join(dir, "apk")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, "", nil
	}
	if err := os.MkdirAll(apkCacheRoot, 0o755); err != nil {
		return "", "", err
	}
	// Another test process may be building the same: one builds, the
	// others wait and find its result.
	lock, err := os.OpenFile(filepath.Join(apkCacheRoot, "apk-tools.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", "", err
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, "", nil
	}
	for _, tool := range []string{"meson", "ninja", "pkg-config", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", "", fmt.Errorf("lab: building apk-tools needs %s (tests/install-deps.sh installs meson ninja-build pkg-config zlib1g-dev libssl-dev libzstd-dev)", tool)
		}
	}
	work, err := os.MkdirTemp(apkCacheRoot, "build-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(work)
	run := func(dir string, argv ...string) error {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: building apk-tools: %q: %v\n%s", argv, err, out)
		}
		return nil
	}
	if err := run(work, "tar", "-xzf", src); err != nil {
		return "", "", err
	}
	top := filepath.Join(work, strings.TrimSuffix(APKToolsTarball, ".tar.gz"))
	if err := run(top, append([]string{"meson", "setup", "build"}, apkSetup...)...); err != nil {
		return "", "", err
	}
	if err := run(top, "ninja", "-C", "build", "src/apk"); err != nil {
		return "", "", err
	}
	if err := run(top, "strip", "build/src/apk"); err != nil {
		return "", "", err
	}
	built := filepath.Join(top, "build", "src", "apk")
	if out, err := exec.Command(built, "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "apk-tools 3.") {
		return "", "", fmt.Errorf("lab: the apk built from %s does not run: %v\n%s", src, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	// Renamed into place last: a cache entry is a whole, working build.
	if err := os.Rename(built, bin+".new"); err != nil {
		return "", "", err
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		return "", "", err
	}
	return bin, "", nil
}
