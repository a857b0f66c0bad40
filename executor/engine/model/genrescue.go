package model

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// WithRescues is the sequence with a rescue file's declarations among its
// steps, drawn from a stream of the seed's own so that the sequence's own
// steps stay what they were: after a declaration of the link's, at times, a
// rescue file declares one or two of the services, packages, files and
// directories the link declared last — a service in the other state, a
// file with other content — under a module of its own (rs), and at times
// the keys file or the shared file whole, over the link's keys, regions or
// file declared whole, or keys or a region of its own in them; later, at
// times, it declares nothing any more, and the link's word applies again.
// A harness that can apply as two sources runs it (executor/engine's, the
// link's declarations as the link's and the rescue's as a local file's);
// the lab, which applies every declaration as a local file, runs the
// sequence without.
func (s Sequence) WithRescues() Sequence {
	rnd := rand.New(rand.NewPCG(s.Seed, 0x5253))
	out := s
	out.Steps = nil
	var last *Declaration
	active, version := false, 0
	for _, st := range s.Steps {
		out.Steps = append(out.Steps, st)
		if st.Decl != nil {
			last = st.Decl
		}
		if last == nil || rnd.IntN(4) > 0 {
			continue
		}
		if active && rnd.IntN(2) == 0 {
			out.Steps = append(out.Steps, Step{What: "the rescue file declares nothing any more", Decl: &Declaration{Rescue: true}})
			active = false
			continue
		}
		var pool []Resource
		for _, r := range last.Resources {
			if r.Kind == "service" || r.Kind == "package" || InTree(r.Name) && (r.Kind == "file" || r.Kind == "directory" || r.Kind == "archive") {
				pool = append(pool, r)
			}
		}
		d := &Declaration{Rescue: true}
		var said []string
		pick := map[int]bool{}
		if len(pool) > 0 {
			pick = map[int]bool{rnd.IntN(len(pool)): true, rnd.IntN(len(pool)): rnd.IntN(2) == 0}
		}
		for i, r := range pool { // in the link's order: a package before its unit's service
			if !pick[i] {
				continue
			}
			r.Module = "rs"
			switch r.Kind {
			case "service":
				r.State = map[string]string{"running": "stopped", "stopped": "running", "": "stopped"}[r.State]
				if rnd.IntN(2) == 0 {
					v := rnd.IntN(2) == 0
					r.Enabled = &v
				}
			case "file":
				version++
				r.Content = fmt.Sprintf("rescued, v%d\n", version)
			}
			d.Resources = append(d.Resources, r)
			said = append(said, r.Key())
		}
		// The keys file or the shared file declared whole, at times: the
		// usual way back in (a known-good sshd_config) over the link's keys,
		// regions, or file declared whole; or keys of its own in the keys
		// file (a key or two of those the link's set, or may), or a region
		// of its own in the shared file, over the link's keys or its file
		// declared whole.
		switch rnd.IntN(6) {
		case 0:
			version++
			// Values of its own: the model compares keys, the machine text,
			// which agree only where the rescue wrote the file last.
			set := map[string]string{"Ka": "rescued", "Kb": fmt.Sprintf("rescued-v%d", version)}
			d.Resources = append(d.Resources, Resource{Kind: "file", Module: "rs", ID: "kw", Name: KeysFile, Set: set, Content: KeysText(set)})
			said = append(said, "rs.kw (the keys file whole)")
		case 1:
			version++
			set := map[string]string{"whole.rs": fmt.Sprintf("rescued, v%d\n", version)}
			d.Resources = append(d.Resources, Resource{Kind: "file", Module: "rs", ID: "sw", Name: SharedFile, Set: set, Content: FileText(set)})
			said = append(said, "rs.sw (the shared file whole)")
		case 2:
			version++
			names := []string{"Ka", "Kb", "Kc", "Kd"}
			set := map[string]string{names[rnd.IntN(4)]: fmt.Sprintf("rescued-v%d", version)}
			set[names[rnd.IntN(4)]] = "rescued"
			d.Resources = append(d.Resources, Resource{Kind: "keys", Module: "rs", ID: "k", Name: KeysFile, Set: set})
			said = append(said, fmt.Sprintf("rs.k (keys %v)", set))
		case 3:
			version++
			d.Resources = append(d.Resources, Resource{Kind: "region", Module: "rs", ID: "r", Name: SharedFile, Content: fmt.Sprintf("rescued block, v%d\n", version)})
			said = append(said, "rs.r (a region of its own)")
		}
		if len(d.Resources) == 0 {
			continue
		}
		out.Steps = append(out.Steps, Step{What: "a rescue file declares " + strings.Join(said, ", "), Decl: d})
		active = true
	}
	return out
}
