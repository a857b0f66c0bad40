package ports

import (
	"net"
	"strconv"
	"testing"
)

// Many ports in a row are all different and each can be bound.
func TestFreeNeverGivesAPortTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		p, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
	}
	for p := range seen {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d, given as free: %v", p, err)
		}
		l.Close()
	}
}
