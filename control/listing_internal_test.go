package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// entry is a registry entry as a watch delivers it.
type entry struct {
	key string
	op  jetstream.KeyValueOp
}

func (e entry) Bucket() string                  { return Bucket }
func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return []byte("{}") }
func (e entry) Revision() uint64                { return 1 }
func (e entry) Created() time.Time              { return time.Time{} }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// A listing is what the registry holds, never part of it: a watch whose
// end-of-values marker comes before the keys the stream holds (its
// pending count given short at the consumer's creation) is read on until
// they came, or the listing fails saying how many came — never a short
// list without an error. A deleted key is delivered and not listed.
func TestAListingIsWholeOrRefused(t *testing.T) {
	want := map[string]bool{"node.a": true, "node.b": true, "node.c": true}
	put := func(k string) jetstream.KeyValueEntry { return entry{k, jetstream.KeyValuePut} }
	cases := []struct {
		name    string
		updates []jetstream.KeyValueEntry
		listed  string
		fails   string
	}{
		{"marker last", []jetstream.KeyValueEntry{put("node.a"), put("node.b"), entry{"node.c", jetstream.KeyValueDelete}, nil}, "node.a node.b", ""},
		{"marker first, the keys after", []jetstream.KeyValueEntry{nil, put("node.a"), put("node.b"), put("node.c")}, "node.a node.b node.c", ""},
		{"marker early, one key never", []jetstream.KeyValueEntry{put("node.a"), nil, put("node.b")}, "", "delivered 2 of the 3 keys"},
		{"a key written meanwhile counts for nothing", []jetstream.KeyValueEntry{put("node.new"), nil, put("node.a")}, "", "delivered 1 of the 3 keys"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch := make(chan jetstream.KeyValueEntry, len(c.updates))
			for _, u := range c.updates {
				ch <- u
			}
			out, err := readListing(context.Background(), ch, want, 200*time.Millisecond)
			if c.fails != "" {
				if err == nil || !strings.Contains(err.Error(), c.fails) {
					t.Fatalf("listed %d, err %v; want an error saying %q", len(out), err, c.fails)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range []string{"node.a", "node.b", "node.c", "node.new"} {
				if out[k] != nil {
					got = append(got, k)
				}
			}
			if strings.Join(got, " ") != c.listed {
				t.Fatalf("listed %q, want %q", got, c.listed)
			}
		})
	}
}
