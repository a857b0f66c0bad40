package control

import (
	"bytes"
	"errors"
	"regexp"
	"testing"
)

// What each command's log says, by the command and -v: a person's command
// says only an error it carries on from, as a sentence with its values;
// -v and serve write log lines (serve's debug lines with -v only).
func TestCommandLogByCommandAndV(t *testing.T) {
	for _, c := range []struct {
		cmd     string
		verbose bool
		want    string // a regexp, the whole of what was written
	}{
		{"assign", false, `^mesh-control assign: the answer was not taken in \(node web1, seq 3, err the registry is full\)\n$`},
		{"token issue", false, `^mesh-control token issue: the answer was not taken in \(node web1, seq 3, err the registry is full\)\n$`},
		{"assign", true, `^time=\S+ level=DEBUG msg=checking node=web1\ntime=\S+ level=INFO msg="node revoked" node=web1\ntime=\S+ level=WARN msg="a report ignored" node=web1\ntime=\S+ level=ERROR msg="the answer was not taken in" node=web1 seq=3 err="the registry is full"\n$`},
		{"serve", false, `^time=\S+ level=INFO msg="node revoked" node=web1\ntime=\S+ level=WARN msg="a report ignored" node=web1\ntime=\S+ level=ERROR msg="the answer was not taken in" node=web1 seq=3 err="the registry is full"\n$`},
		{"serve", true, `^time=\S+ level=DEBUG msg=checking node=web1\n`},
	} {
		var b bytes.Buffer
		log := commandLog(c.cmd, &b, c.verbose).With("node", "web1")
		log.Debug("checking")
		log.Info("node revoked")
		log.Warn("a report ignored")
		log.Error("the answer was not taken in", "seq", 3, "err", errors.New("the registry is full"))
		if !regexp.MustCompile(c.want).MatchString(b.String()) {
			t.Errorf("%s, -v %v: wrote\n%s", c.cmd, c.verbose, b.String())
		}
	}
}
