package control

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
)

// stamp is link x's time as a heartbeat says it: A before B before C ….
func stamp(x rune) []byte {
	return []byte(time.Date(2026, 12, 7, 7, 0, int(x-'A'), 0, time.UTC).Format(time.RFC3339Nano))
}

// One agent's links only go forward; two agents' heartbeats alternate.
// heard counts a heartbeat of an older link right after one of the
// newest, and says two agents from the second within the hour: not of
// relinks, nor of one agent's late heartbeats of its old link (a burst
// out of the newest, once), nor of its clock gone back between links.
func TestTwoAgentsAreTheLinksThatAlternate(t *testing.T) {
	for _, c := range []struct {
		links string // each heartbeat's link, a letter each (A the oldest); ' ' an hour and more passes
		want  string // heard's answer to each: . no, ! two agents, ' ' the hour
	}{
		{"AAAA", "...."},
		{"AABBBCCC", "........"}, // relinks: forward only
		{"ABA", "..."},           // one late heartbeat of the link before
		{"ABAAAB", "......"},     // a burst of them, the old socket's, after the new link's first
		{"ABAB", "...."},
		{"ABABA", "....!"}, // the second return out of the newest
		{"ABABABAB", "....!.!."},
		{"ABCABCA", "......!"}, // three in turn: once a round
		{"CBBBAAA", "......."}, // one agent whose clock went back at each relink
		{"ABA BA", "... .."},   // late heartbeats an hour apart: one agent still
		{"ABAB ABABA", ".... ..!.!"},
	} {
		var l links
		var got string
		now := int64(1_000_000)
		for _, x := range c.links {
			if x == ' ' {
				now += 3601
				got += " "
				continue
			}
			now += 30
			if two, _ := l.heard(uint64(x), stamp(x), now); two {
				got += "!"
			} else {
				got += "."
			}
		}
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.links, got, c.want)
		}
	}
	// What is said of them is the newest link; the caller has the other.
	var l links
	for i, x := range "ABAB" {
		l.heard(uint64(x), stamp(x), int64(100+30*i))
	}
	if two, newest := l.heard('A', stamp('A'), 300); !two || newest != string(stamp('B')) {
		t.Fatalf("two %v, newest %q", two, newest)
	}
}

// The link time is found in a heartbeat's bytes as the agent encodes it;
// the zero time, or none, is no link.
func TestLinkOfAHeartbeat(t *testing.T) {
	for data, want := range map[string]string{
		`{"node":"n1","linked_since":"2026-12-07T07:00:00.123456789Z","last_linked":"x"}`: "2026-12-07T07:00:00.123456789Z",
		`{"node":"n1","linked_since":"0001-01-01T00:00:00Z"}`:                             "",
		`{"node":"n1"}`:                   "",
		`{"node":"n1","linked_since":"`:   "",
		`{"node":"n1","linked_since":""}`: "",
	} {
		text, _, ok := linkOf([]byte(data))
		if string(text) != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", data, text, ok, want)
		}
	}
}

// BenchmarkHeartbeatLink is what watchLinks costs each heartbeat of one
// agent (the fleet's every heartbeat): the link found in the bytes and
// compared with the last.
func BenchmarkHeartbeatLink(b *testing.B) {
	data, _ := json.Marshal(&link.Heartbeat{Node: "node-04711", Enrolment: "e-0123456789abcdef0123", At: time.Now().UTC(), Interval: 30,
		State: link.StateEnrolled, Presence: link.PresenceResident, AgentVersion: "1.2.3", AgentBuild: "abcdef0",
		Executor: &link.ExecutorStatus{Version: "1.2.3", Build: "abcdef0", Seq: 42}, LastApplied: 42,
		LinkedSince: time.Now().Add(-time.Hour).UTC(), LastLinked: time.Now().Add(-2 * time.Hour).UTC()})
	var l links
	text, h, _ := linkOf(data)
	l.heard(h, text, 0)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, h, ok := linkOf(data)
		if !ok || h != l.cur {
			b.Fatal("another link")
		}
	}
}
