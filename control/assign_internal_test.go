package control

import (
	"encoding/json"
	"testing"
)

// What a recorded composition carried: nothing while it is a claim (no
// sequence); the module with the resources assigned now, not another
// version of it; and, for a record written before compositions said what
// each module carried, the module by its name.
func TestWhatACompositionCarried(t *testing.T) {
	v1 := Assignment{Module: "web", Resources: []json.RawMessage{json.RawMessage(`{"id":"a"}`)}}
	v2 := Assignment{Module: "web", Resources: []json.RawMessage{json.RawMessage(`{"id":"b"}`)}}
	db := Assignment{Module: "db", Resources: v1.Resources}
	now := composedRecord{Seq: 7, Modules: []string{"web"}, Carried: map[string]string{"web": moduleDigest(v1.Resources)}}
	for _, c := range []struct {
		name string
		p    composedRecord
		m    Assignment
		want bool
	}{
		{"carried as assigned", now, v1, true},
		{"another version carried", now, v2, false},
		{"not carried", now, db, false},
		{"a claim", composedRecord{Modules: now.Modules, Carried: now.Carried}, v1, false},
		{"a composition of none", composedRecord{Seq: 7}, v1, false},
		{"an earlier record, by name", composedRecord{Seq: 7, Modules: []string{"web"}}, v2, true},
		{"an earlier record, not named", composedRecord{Seq: 7, Modules: []string{"web"}}, db, false},
	} {
		if got := c.p.carried(c.m); got != c.want {
			t.Errorf("%s: carried %v, want %v", c.name, got, c.want)
		}
	}
}
