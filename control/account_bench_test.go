package control

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/link"
)

// BenchmarkNodeAccount is what a node's own account costs the embedded
// broker: its heap after b.N nodes' accounts are made, with their
// imports, as a node's first connection makes them (registryAuth.
// nodeAccount), in KiB an account: for an agent of today (by-node), and
// for a node whose agents have linked in both layouts. Most of it is
// nats-server's own: every account gets the system account's imports,
// and JetStream requires the system account (docs/benchmarks.md).
func BenchmarkNodeAccount(b *testing.B) {
	for _, c := range []struct {
		name    string
		layouts []link.Layout
	}{
		{"by-node", []link.Layout{link.LayoutByNode}},
		{"both-layouts", []link.Layout{link.LayoutByNode, link.LayoutByKind}},
	} {
		b.Run(c.name, func(b *testing.B) { benchNodeAccount(b, c.layouts) })
	}
}

func benchNodeAccount(b *testing.B, layouts []link.Layout) {
	k, err := Init(b.TempDir(), []string{"127.0.0.1"}, "tls://127.0.0.1:4222")
	if err != nil {
		b.Fatal(err)
	}
	s, err := startServer(k, "127.0.0.1:0", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown()
	heap := func() uint64 {
		runtime.GC()
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, l := range layouts {
			if _, err := s.auth.nodeAccount(fmt.Sprintf("n%d", i), l); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(heap()-before)/float64(b.N)/1024, "KiB/account")
}
