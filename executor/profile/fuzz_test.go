package profile

import "testing"

// The profile reads what other programs and the kernel print. Each reader
// must survive anything: a hostile container runtime answering _ping, a
// strange /proc. These targets only ask that nothing panics and that a
// parse that succeeds says something coherent.

func FuzzParsePing(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nServer: Docker/24\r\nContent-Length: 2\r\n\r\nOK"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 500 Internal Server Error\r\n\r\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		parsePing(raw)
		dechunk(raw)
	})
}

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
