package control

import (
	"strings"
	"testing"
	"time"
)

// The enrolment's own rule for a rekey token, whatever the token's record
// says (a revocation withdraws it, but a withdrawal can fail): it enrols
// only the live enrolment whose pending rekey it is.
func TestARekeyTokenStandsOnlyForTheLiveEnrolmentThatAsked(t *testing.T) {
	tok := &TokenRecord{ID: "0123456789abcdef", Node: "n1", Rekey: true}
	live := func(change func(*NodeRecord)) *NodeRecord {
		r := &NodeRecord{Name: "n1", NKey: "UAGENT", Enrolment: "e-1", Rekey: &RekeyRecord{Nonce: "aa", Token: tok.ID}}
		if change != nil {
			change(r)
		}
		return r
	}
	for _, c := range []struct {
		name string
		rec  *NodeRecord
		want string // in the refusal; "" for none
	}{
		{"the live enrolment's pending rekey", live(nil), ""},
		{"revoked", live(func(r *NodeRecord) { revokeRecord(r) }), "was revoked"},
		{"revoked, its rekey left behind", live(func(r *NodeRecord) { r.NKey, r.Revoked = "", time.Now() }), "was revoked"},
		{"enrolled again since", live(func(r *NodeRecord) { r.Enrolment, r.Rekey = "e-2", nil }), "no longer node n1's"},
		{"asked again since", live(func(r *NodeRecord) { r.Rekey = &RekeyRecord{Nonce: "bb", Token: "fedcba9876543210"} }), "no longer node n1's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := rekeyStands(c.rec, tok)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Fatalf("rekeyStands = %q, want %q", got, c.want)
			}
		})
	}
}
