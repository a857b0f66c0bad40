package control

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The node's profile is the input to deciding what it runs: a module whose
// resources need a capability the node said it lacks is refused at assign,
// naming the capability and the node's own reason, before anything is kept
// — rather than kept, published, and refused by the node.

// needs is the capability of executor/profile each shape needs (shapes
// not listed need none the profile says).
var needs = map[string]string{
	shapes.TypeContainer: "container-runtime",
	shapes.TypeNetwork:   "container-runtime",
	shapes.TypePackage:   "package-manager",
	shapes.TypeService:   "service-manager",
	shapes.TypeProcess:   "service-manager",
	shapes.TypeOpening:   "firewall",
	shapes.TypeOverlay:   "overlay",
}

// LackingError refuses a module for what the node's profile lacks.
type LackingError struct {
	Node, Module string
	// Lacks is each missing capability with the first resource needing it
	// and the node's reason.
	Lacks []string
}

func (e *LackingError) Error() string {
	return fmt.Sprintf("%s cannot run module %s, by the profile it reported: %s; not assigned (nothing kept)", e.Node, e.Module, strings.Join(e.Lacks, "; "))
}

// checkProfile refuses module's resources for node when they need a
// capability its last reported profile says it lacks. A node that has
// reported no profile yet is not refused: nothing is known to hold against
// the module, and the node refuses what it cannot do itself.
func (c *Client) checkProfile(ctx context.Context, node, module string, resources []json.RawMessage) error {
	var kp keptProfile
	if !c.getJSON(ctx, "profile."+node, &kp) || len(kp.Profile) == 0 {
		return nil
	}
	var prof struct {
		Capabilities []struct {
			Name    string `json:"name"`
			Present bool   `json:"present"`
			Reason  string `json:"reason"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(kp.Profile, &prof) != nil {
		return nil
	}
	absent := map[string]string{}
	for _, cp := range prof.Capabilities {
		if !cp.Present {
			absent[cp.Name] = cp.Reason
		}
	}
	seen := map[string]bool{}
	var lacks []string
	for _, r := range resources {
		var h shapes.Base
		if json.Unmarshal(r, &h) != nil {
			continue
		}
		need := needs[h.Type]
		why, lacking := absent[need]
		if need == "" || !lacking || seen[need] {
			continue
		}
		seen[need] = true
		lacks = append(lacks, fmt.Sprintf("%s (%s %s.%s needs it; the node says: %s)", need, h.Type, h.Module, h.ID, why))
	}
	if len(lacks) > 0 {
		return &LackingError{Node: node, Module: module, Lacks: lacks}
	}
	return nil
}
