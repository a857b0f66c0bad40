package control

import (
	"fmt"
	"testing"
)

// One agent's links only go forward; two agents' heartbeats alternate.
// heard says two agents from the second return to a recent link within
// the hour, and not before, nor of relinks, nor of one heartbeat of an old
// link heard late now and then.
func TestTwoAgentsAreTheLinksThatAlternate(t *testing.T) {
	for _, c := range []struct {
		links string // each heartbeat's link, a letter each; ' ' an hour and more passes
		want  string // heard's answer to each: . no, ! two agents, ' ' the hour
	}{
		{"AAAA", "...."},
		{"AABBBCCC", "........"}, // relinks: forward only
		{"ABA", "..."},           // one late heartbeat of the link before
		{"ABAB", "...!"},         // the second return
		{"ABABABAB", "...!!!!!"},
		{"AABBAABB", "......!."},
		{"ABACAC", "....!!"}, // the second agent relinked (B, then C): still two
		{"ABCABC", "....!!"}, // three in turn
		{"ABCDEA", "......"}, // a link four relinks back is forgotten
		{"ABA B", "... ."},   // a late heartbeat an hour after another: one agent still
		{"ABAB ABAB", "...! .!!!"},
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
			if two, _ := l.heard(uint64(x), []byte(fmt.Sprintf("t%c", x)), now); two {
				got += "!"
			} else {
				got += "."
			}
		}
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.links, got, c.want)
		}
	}
	// What is said of them is both links.
	var l links
	l.heard(1, []byte("tA"), 100)
	l.heard(2, []byte("tB"), 130)
	l.heard(1, []byte("tA"), 160)
	if two, other := l.heard(2, []byte("tB"), 190); !two || other != "tA" || l.text != "tB" {
		t.Fatalf("two %v, links %q %q", two, other, l.text)
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
