package agent

import (
	"bytes"
	"context"
	"testing"
)

// The version, asked as a flag or as a command, in the form all four
// binaries print it; another argument is refused.
func TestVersionAsFlagOrCommand(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), "1.2.3", "b7", args, &out, &errb); code != 0 || out.String() != "mesh-agent 1.2.3 build b7\n" {
			t.Fatalf("%v: exit %d, %q %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), "1.2.3", "b7", []string{"versions"}, &out, &errb); code != 2 || out.Len() != 0 {
		t.Fatalf("versions: exit %d, %q", code, out.String())
	}
}
