package link

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Reports are spread over ReportPartitions streams by the node's name, as
// NATS' maintainers advise for a stream whose writes outrun one writer
// (deterministic subject token partitioning): with the broker's
// sync_interval "always", a stream fsyncs each write on its own, one
// after another, so one stream took the reports of a fan-out to 10,000
// nodes a second and more after the last node had its declaration
// (docs/benchmarks.md); the disk takes fsyncs side by side that one
// stream makes one at a time.
//
// The node keeps publishing on mesh.report.<node> (Subjects.Report): a
// mapping in CONTROL (ReportMapping), which nats-server applies to what
// a node's service import brings too, puts each report on
// mesh.report.<partition>.<node>, captured by that partition's stream. A
// node is always in the same partition (ReportPartitionOf), so the order
// of its reports is their order in one stream. A broker whose
// configuration lacks the mapping (written before it) still works: its
// reports stay on mesh.report.<node>, which ReportStream captures as it
// always did.
//
// The partitions' sequences start at ReportPartitionFirstSeq, above any
// ReportStream will reach, so a node's first report in its partition is
// newer, by sequence, than its last in ReportStream (the recorder keeps a
// node's newest by stream sequence): a broker given the mapping moves its
// nodes forward, never back. The count is fixed for good: another would
// move nodes to partitions whose sequences do not order against those of
// the partition before.
const (
	ReportPartitions        = 4
	ReportPartitionFirstSeq = 1 << 40
)

// ReportMapping is CONTROL's subject mapping that spreads reports over
// the partitions: nats-server's partition function over the node's token
// (FNV-1a, modulo ReportPartitions; ReportPartitionOf is the same).
var ReportMapping = struct{ From, To string }{
	"mesh.report.*",
	"mesh.report.{{partition(" + strconv.Itoa(ReportPartitions) + ",1)}}.{{wildcard(1)}}",
}

// ReportPartitionOf is the partition node's reports go to: what the
// broker's partition function gives for the node's token (FNV-1a, 32
// bits, modulo the partitions); link's tests hold the two to each other
// through a real broker.
func ReportPartitionOf(node string) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % ReportPartitions)
}

// ReportPlace is one stream reports are kept in, and the subject of all
// its nodes' reports there.
type ReportPlace struct {
	Stream, Subjects string
	// FirstSeq is the stream's first sequence when made (0: 1).
	FirstSeq uint64
}

// ReportPlaces are the streams of reports: ReportStream first (a broker
// without the mapping), then the partitions.
func ReportPlaces() []ReportPlace {
	out := []ReportPlace{{ReportStream, "mesh.report.*", 0}}
	for i := range ReportPartitions {
		p := strconv.Itoa(i)
		out = append(out, ReportPlace{ReportStream + "_" + p, "mesh.report." + p + ".*", ReportPartitionFirstSeq})
	}
	return out
}

// StreamSubject is one subject of one stream: where one node's reports
// are in one of their streams (NodeReports), or any other of its subjects.
type StreamSubject struct{ Stream, Subject string }

// NodeReports are where node's reports are, in their order: those of
// ReportStream (a broker without the mapping; before it) older than
// those of its partition.
func NodeReports(node string) []StreamSubject {
	return []StreamSubject{{ReportStream, "mesh.report." + node}, NodeReportPartition(node)}
}

// NodeReportPartition is where node's reports are through a broker with
// the mapping: its partition's stream.
func NodeReportPartition(node string) StreamSubject {
	p := strconv.Itoa(ReportPartitionOf(node))
	return StreamSubject{ReportStream + "_" + p, "mesh.report." + p + "." + node}
}

// ReportNode is the node a report's subject is of, in any of the report
// streams: its last token.
func ReportNode(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
