package shapegen

import (
	"errors"
	"testing"

	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// What the generator makes is valid: every shape, with its optional fields
// present and absent, parses as a trusted declaration, and over the link
// too unless it is an action (which the link never carries).
func TestEveryGeneratedDeclarationIsValid(t *testing.T) {
	o := Options{Node: "n1", Enrolment: "e-1", Seq: 1}
	for seed := range uint64(200) {
		g := New(seed, "/srv/gen")
		for typ, d := range g.Each(o) {
			if _, err := shapes.ParseTrusted(d); err != nil {
				t.Fatalf("seed %d, %s: %v\n%s", seed, typ, err, d)
			}
			_, err := shapes.Parse(d)
			switch {
			case typ == shapes.TypeAction && !errors.Is(err, shapes.ErrAction):
				t.Fatalf("seed %d: the link's parser took an action: %v", seed, err)
			case typ != shapes.TypeAction && err != nil:
				t.Fatalf("seed %d, %s over the link: %v\n%s", seed, typ, err, d)
			}
		}
		d := g.Declaration(o)
		if _, err := shapes.ParseTrusted(d); err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, d)
		}
	}
}

// Every shape of the vocabulary has a generator: a new shape without one
// fails here, not silently in the tests that iterate over Types.
func TestEveryShapeIsGenerated(t *testing.T) {
	g := New(1, "/srv/gen")
	if got, want := len(g.Each(Options{Node: "n", Enrolment: "e", Seq: 1})), len(shapes.TypeNames()); got != want {
		t.Fatalf("%d shapes generated, %d in the vocabulary", got, want)
	}
}
