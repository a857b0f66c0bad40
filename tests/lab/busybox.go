package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Alpine's busybox for the labs. Alpine makes system users with busybox's
// adduser and addgroup, and the host's post-install does so there; but
// Debian builds both of its busyboxes (busybox and busybox-static) with
// those applets, and deluser and delgroup, turned off, since its passwd
// and adduser packages provide the commands. So the tests build busybox
// from Debian's own busybox source package, fetched with apt-get source
// from the machine's Debian repositories (signed, as every Debian package
// is), with Debian's static configuration and those four applets turned
// on, with Alpine's ranges of ids. What runs in the lab is then busybox's
// own adduser: the same code Alpine's busybox runs, not a stand-in.

// BusyboxApplets are the applets the build turns on, beyond Debian's
// configuration: what Alpine's busybox has that Debian's does not, for
// accounts. BusyboxAlpine checks the binary lists each of them.
var BusyboxApplets = []string{"adduser", "addgroup", "deluser", "delgroup"}

// busyboxConfig is what the build changes in Debian's static
// configuration: the applets, and the id ranges of Alpine's busybox
// (system ids from 100 to 999, others up to 60000; Debian leaves them
// 0, unused while the applets are off). Part of the cache key.
var busyboxConfig = map[string]string{
	"CONFIG_ADDUSER":                     "y",
	"CONFIG_ADDGROUP":                    "y",
	"CONFIG_DELUSER":                     "y",
	"CONFIG_DELGROUP":                    "y",
	"CONFIG_FEATURE_ADDUSER_TO_GROUP":    "y",
	"CONFIG_FEATURE_DEL_USER_FROM_GROUP": "y",
	"CONFIG_LAST_ID":                     "60000",
	"CONFIG_FIRST_SYSTEM_ID":             "100",
	"CONFIG_LAST_SYSTEM_ID":              "999",
}

var (
	bbOnce sync.Once
	bbPath string
	bbErr  error
)

// BusyboxAlpine returns the path of a static busybox built from Debian's
// busybox source package with the applets Alpine's has for accounts
// (BusyboxApplets), building it once per cache key (the source package's
// .dsc and the configuration) under /var/cache/nox-mesh-test and once per
// process. The source is fetched once, into the same cache, by apt-get
// source from the deb-src twins of the machine's own Debian sources (an
// apt state of the cache's own: the machine's apt configuration is not
// changed). A fetch or a build that fails fails the test: the Debian
// registry is reachable wherever the tests run, and install-deps.sh
// installs what the build needs (dpkg-dev, bzip2, gcc, make).
func BusyboxAlpine(t testing.TB) string {
	t.Helper()
	bbOnce.Do(func() { bbPath, bbErr = buildBusybox() })
	if bbErr != nil {
		t.Fatal(bbErr)
	}
	return bbPath
}

func buildBusybox() (string, error) {
	if err := os.MkdirAll(apkCacheRoot, 0o755); err != nil {
		return "", err
	}
	// One process fetches and builds; the others wait and find its result.
	lock, err := os.OpenFile(filepath.Join(apkCacheRoot, "busybox.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	srcDir := filepath.Join(apkCacheRoot, "src", "busybox")
	dsc, err := busyboxSource(srcDir)
	if err != nil {
		return "", err
	}
	dscData, err := os.ReadFile(dsc)
	if err != nil {
		return "", err
	}
	var keys []string
	for k := range busyboxConfig {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	h.Write(dscData)
	for _, k := range keys {
		fmt.Fprintf(h, "\n%s=%s", k, busyboxConfig[k])
	}
	dir := filepath.Join(apkCacheRoot, "busybox-"+hex.EncodeToString(h.Sum(nil)[:8]))
	bin := filepath.Join(dir, "busybox")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	for _, tool := range []string{"dpkg-source", "make", "cc", "bzip2"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("lab: building busybox needs %s (tests/install-deps.sh installs dpkg-dev, make, gcc and bzip2)", tool)
		}
	}
	work, err := os.MkdirTemp(apkCacheRoot, "busybox-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	run := func(dir string, stdin string, argv ...string) error {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "KCONFIG_NOTIMESTAMP=1", "LC_ALL=C")
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: building busybox: %q: %w\n%s", argv, err, tail(out, 4000))
		}
		return nil
	}
	// dpkg-source checks the tarballs against the .dsc's checksums, and
	// applies Debian's patches.
	top := filepath.Join(work, "busybox")
	if err := run(work, "", "dpkg-source", "-x", dsc, top); err != nil {
		return "", err
	}
	cfg, err := busyboxDotConfig(top)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(top, ".config"), cfg, 0o644); err != nil {
		return "", err
	}
	// oldconfig asks for anything the configuration does not say; an
	// empty answer takes the default, as debian/rules does.
	if err := run(top, strings.Repeat("\n", 2000), "make", "silentoldconfig"); err != nil {
		return "", err
	}
	if err := checkBusyboxConfig(filepath.Join(top, ".config")); err != nil {
		return "", err
	}
	if err := run(top, "", "make", "-j2", "busybox"); err != nil {
		return "", err
	}
	built := filepath.Join(top, "busybox")
	out, err := exec.Command(built, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("lab: the busybox built from %s does not run: %w", dsc, err)
	}
	have := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		have[a] = true
	}
	for _, a := range append([]string{"httpd"}, BusyboxApplets...) {
		if !have[a] {
			return "", fmt.Errorf("lab: the busybox built from %s has no %s applet", dsc, a)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Renamed into place last: a cache entry is a whole, working build.
	if err := os.Rename(built, bin+".new"); err != nil {
		return "", err
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		return "", err
	}
	return bin, nil
}

// busyboxDotConfig is Debian's configuration of busybox-static (its Linux
// part, then the flavour's, as debian/rules concatenates them; the first
// assignment wins) with busyboxConfig's lines in place of Debian's.
func busyboxDotConfig(top string) ([]byte, error) {
	var b strings.Builder
	for _, f := range []string{"debian/config/os/linux", "debian/config/pkg/static"} {
		data, err := os.ReadFile(filepath.Join(top, f))
		if err != nil {
			return nil, fmt.Errorf("lab: Debian's busybox source has no %s: %w", f, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if _, ours := busyboxConfig[configName(line)]; !ours {
				b.WriteString(line + "\n")
			}
		}
	}
	var keys []string
	for k := range busyboxConfig {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(k + "=" + busyboxConfig[k] + "\n")
	}
	return []byte(b.String()), nil
}

// configName is the option a .config line sets or unsets ("" for others).
func configName(line string) string {
	if n, ok := strings.CutPrefix(line, "# "); ok {
		if n, ok := strings.CutSuffix(n, " is not set"); ok {
			return n
		}
		return ""
	}
	n, _, _ := strings.Cut(line, "=")
	return n
}

// checkBusyboxConfig checks oldconfig kept every line of busyboxConfig:
// it silently drops a value it finds out of range.
func checkBusyboxConfig(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		have[line] = true
	}
	for k, v := range busyboxConfig {
		if !have[k+"="+v] {
			return fmt.Errorf("lab: busybox's configuration does not keep %s=%s", k, v)
		}
	}
	return nil
}

// busyboxSource returns the .dsc of Debian's busybox source package in
// dir, fetching it there first when dir holds none.
func busyboxSource(dir string) (string, error) {
	if m, _ := filepath.Glob(filepath.Join(dir, "busybox_*.dsc")); len(m) == 1 {
		return m[0], nil
	}
	state := filepath.Join(apkCacheRoot, "apt-src")
	if err := os.RemoveAll(state); err != nil {
		return "", err
	}
	parts := filepath.Join(state, "sources.list.d")
	for _, d := range []string{parts, filepath.Join(state, "lists", "partial"), filepath.Join(state, "cache", "archives", "partial")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	n, err := debSources(parts)
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", errors.New("lab: the machine's apt sources name no Debian repository to fetch busybox's source from")
	}
	empty := filepath.Join(state, "sources.list")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		return "", err
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + empty, "-o", "Dir::Etc::SourceParts=" + parts,
		"-o", "Dir::State::Lists=" + filepath.Join(state, "lists"), "-o", "Dir::Cache=" + filepath.Join(state, "cache"),
		// The files are root's, in root's cache: apt's download user
		// could not write there.
		"-o", "APT::Sandbox::User=root", "-o", "Acquire::Retries=3",
	}
	tmp := dir + ".fetch"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	apt := func(args ...string) error {
		cmd := exec.Command("apt-get", append(opts, args...)...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: fetching Debian's busybox source: apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out, 4000))
		}
		return nil
	}
	// An update that fails for one of several repositories (a third
	// party's without sources) still fetches Debian's: apt-get source says
	// whether it has what it needs.
	_ = apt("update")
	if err := apt("source", "--download-only", "busybox"); err != nil {
		return "", err
	}
	m, _ := filepath.Glob(filepath.Join(tmp, "busybox_*.dsc"))
	if len(m) != 1 {
		return "", fmt.Errorf("lab: apt-get source busybox left %v", m)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(m[0])), nil
}

// debSources writes into dir the deb-src twin of each Debian source the
// machine's apt has (sources.list, *.list, deb822 *.sources), and says
// how many files it wrote.
func debSources(dir string) (int, error) {
	n := 0
	write := func(name, text string) error {
		n++
		return os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-%s", n, name)), []byte(text), 0o644)
	}
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, f := range append([]string{"/etc/apt/sources.list"}, lists...) {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		var out []string
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "deb "); ok && strings.Contains(rest, "debian") {
				out = append(out, "deb-src "+rest)
			}
		}
		if len(out) > 0 {
			if err := write(filepath.Base(f)+".list", strings.Join(out, "\n")+"\n"); err != nil {
				return 0, err
			}
		}
	}
	sources, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range sources {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		if !strings.Contains(string(data), "debian") {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for i, line := range lines {
			if strings.HasPrefix(line, "Types:") {
				lines[i] = "Types: deb-src"
			}
		}
		if err := write(filepath.Base(f), strings.Join(lines, "\n")); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// tail is the last n bytes of out, for an error message.
func tail(out []byte, n int) []byte {
	if len(out) > n {
		return out[len(out)-n:]
	}
	return out
}
