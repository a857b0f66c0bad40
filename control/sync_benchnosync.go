//go:build benchnosync

package control

// A comparison build for the fleet bench only (make bench-scale
// BENCH_SCALE_ARGS=-sync-default): nats-server's default sync interval,
// under which an acknowledged write is not on disk for up to two minutes.
// Never built by the Makefile's other targets or the packages.
func init() { JetStreamSync = "" }
