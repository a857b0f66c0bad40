package profile

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Inventory is what the machine is, as opposed to what it can do.
type Inventory struct {
	Hostname    string `json:"hostname"`
	MachineID   string `json:"machine_id"` // "" when the machine has none (Android, some containers)
	Arch        string `json:"arch"`       // runtime.GOARCH, plus the kernel's machine when they disagree
	Kernel      string `json:"kernel"`     // uname release
	OSRelease   string `json:"os_release"` // PRETTY_NAME of os-release; "" when there is none
	MemoryBytes uint64 `json:"memory_bytes"`
	CPUs        int    `json:"cpus"`
	HostVersion string `json:"host_version"`
	Holds       int    `json:"holds"` // filled by the caller (how many resources the host owns)
}

// Collect reads the inventory. A file a machine may legitimately lack
// (machine-id, os-release) leaves its field empty; anything else that fails
// is returned, joined, with every field that could be read still filled.
func Collect(ctx context.Context, hostVersion string) (Inventory, error) {
	inv := Inventory{HostVersion: hostVersion, Arch: runtime.GOARCH, CPUs: runtime.NumCPU()}
	if err := ctx.Err(); err != nil {
		return inv, fmt.Errorf("profile: inventory: %w", err)
	}
	var errs []error
	fail := func(what string, err error) { errs = append(errs, fmt.Errorf("profile: inventory: %s: %w", what, err)) }

	var err error
	if inv.Hostname, err = os.Hostname(); err != nil {
		fail("hostname", err)
	}

	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		fail("uname", err)
	} else {
		inv.Kernel = utsString(uts.Release[:])
		inv.Arch = archOf(runtime.GOARCH, utsString(uts.Machine[:]))
	}

	if id, err := firstFile("/etc/machine-id", "/var/lib/dbus/machine-id"); err != nil {
		fail("machine-id", err)
	} else if id = strings.TrimSpace(id); id != "" && !isMachineID(id) {
		fail("machine-id", fmt.Errorf("malformed %q", id))
	} else {
		inv.MachineID = id
	}

	if osr, err := firstFile("/etc/os-release", "/usr/lib/os-release"); err != nil {
		fail("os-release", err)
	} else {
		inv.OSRelease = parseOSRelease(osr)["PRETTY_NAME"]
	}

	if mem, err := os.ReadFile("/proc/meminfo"); err != nil {
		fail("meminfo", err)
	} else if inv.MemoryBytes, err = parseMemTotal(string(mem)); err != nil {
		fail("meminfo", err)
	}
	return inv, errors.Join(errs...)
}

// firstFile returns the content of the first of paths that exists, or ""
// when none does.
func firstFile(paths ...string) (string, error) {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		return string(b), err
	}
	return "", nil
}

func isMachineID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// archOf is goarch, with the kernel's machine added when it is not the one
// goarch runs as (a 32-bit build on a 64-bit kernel, say).
func archOf(goarch, machine string) string {
	same := map[string][]string{
		"amd64": {"x86_64"}, "386": {"i386", "i486", "i586", "i686"}, "arm64": {"aarch64", "arm64"},
		"arm": {"armv6l", "armv7l", "armv8l"}, "riscv64": {"riscv64"}, "ppc64le": {"ppc64le"},
		"s390x": {"s390x"}, "loong64": {"loongarch64"}, "mips64le": {"mips64"}, "mipsle": {"mips"},
	}
	for _, m := range same[goarch] {
		if m == machine {
			return goarch
		}
	}
	if machine == "" {
		return goarch
	}
	return goarch + " (kernel " + machine + ")"
}

// utsString turns a NUL-terminated utsname field into a string.
func utsString[T int8 | uint8](f []T) string {
	b := make([]byte, 0, len(f))
	for _, c := range f {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// parseOSRelease reads os-release(5): KEY=value lines, the value optionally
// in single or double quotes, with backslash escapes inside double quotes.
func parseOSRelease(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, "=")
		if !ok || line == "" || line[0] == '#' {
			continue
		}
		v = strings.TrimSpace(v)
		switch {
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			var b strings.Builder
			inner := v[1 : len(v)-1]
			for i := 0; i < len(inner); i++ {
				if inner[i] == '\\' && i+1 < len(inner) {
					i++
				}
				b.WriteByte(inner[i])
			}
			v = b.String()
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = v[1 : len(v)-1]
		}
		out[strings.TrimSpace(k)] = v
	}
	return out
}

// parseMemTotal returns MemTotal from /proc/meminfo in bytes.
func parseMemTotal(s string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("MemTotal: %w", err)
		}
		if len(f) > 1 && f[1] != "kB" {
			return 0, fmt.Errorf("MemTotal: unit %q, not kB", f[1])
		}
		if len(f) == 1 {
			return n, nil
		}
		return n * 1024, nil
	}
	return 0, errors.New("no MemTotal line")
}
