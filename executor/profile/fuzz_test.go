package profile

import "testing"

// The profile reads what other programs and the kernel print. Each reader
// must survive anything: a strange /proc. (A hostile container runtime's
// answers are fuzzed where they are parsed: executor/dockerapi.) These targets only ask that nothing panics and that a
// parse that succeeds says something coherent.

func FuzzParseProc(f *testing.F) {
	f.Add("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n", "MemTotal:       24576000 kB\n", "1 (systemd) S 0 1 1", "CapEff:\t000001fffeffffff\n")
	f.Add("A='b c'\n#x\n=", "MemTotal: x kB", "12 (a) b) R 1", "CapEff: zz")
	f.Fuzz(func(t *testing.T, osRelease, meminfo, stat, status string) {
		parseOSRelease(osRelease)
		if n, err := parseMemTotal(meminfo); err == nil && n == 0 && len(meminfo) == 0 {
			t.Fatal("empty meminfo parsed as a total")
		}
		parseStat(stat)
		parseCapEff(status)
		parseSystemState(osRelease)
	})
}
