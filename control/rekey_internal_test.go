package control

import (
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// A broker address is taken as the agent and nats.go take it, and handed
// on in the one form every reader of a token takes (wire.ParseToken):
// tls://, no space. What is refused names no broker a node could reach.
func TestBrokerURLs(t *testing.T) {
	for s, want := range map[string]string{
		"tls://10.0.0.1:4222":                        "tls://10.0.0.1:4222",
		"tls://a.example:4222,tls://b.example:4222":  "tls://a.example:4222,tls://b.example:4222",
		"tls://[fd00::1]:4222":                       "tls://[fd00::1]:4222",
		"nats://10.0.0.1:4222":                       "tls://10.0.0.1:4222",
		"tls://10.0.0.1":                             "tls://10.0.0.1",
		"tls://a.example:4222, tls://b.example:4222": "tls://a.example:4222,tls://b.example:4222",
		" tls://a,nats://b ,tls://c ":                "tls://a,tls://b,tls://c",
		"tls://mesh.example.org.:4222":               "tls://mesh.example.org.:4222",
		"":                                           "",
		"file:///etc/passwd":                         "",
		"tls://user:pw@10.0.0.1:4222":                "",
		"tls://10.0.0.1:4222/x":                      "",
		"tls://10.0.0.1:4222,":                       "",
		"tls://10.0.0.1:4222,http://x:1":             "",
		"tls://10.0.0.1:abc":                         "",
		"tls://10.0.0.1:":                            "",
		" ":                                          "",
		"tls:10.0.0.1":                               "",
		"tls://10.0.0.1:0":                           "",
		"tls://10.0.0.1:70000":                       "",
		"tls://10.0.0.1:4222?x=1":                    "",
		"banana":                                     "",
		"tls://fd00::1":                              "",
		"tls://fd00::1:4222,tls://a":                 "",
		"tls://a:4222," + strings.Repeat("tls://b:4222,", 19) + "tls://c:4222": "",
		strings.Repeat("tls://b:4222,", 18) + "nats://c:4222":                  strings.Repeat("tls://b:4222,", 18) + "tls://c:4222",
	} {
		got, err := brokerURLsOf(s)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("%q: %q (%v), want %q", s, got, err, want)
			continue
		}
		if want == "" {
			continue
		}
		// What a token carries, its reader takes.
		tok := &wire.Token{BrokerURL: got, ControlKey: make([]byte, 32), Expires: time.Now().Add(time.Hour)}
		text, err := tok.Encode()
		if err == nil {
			_, err = wire.ParseToken(text)
		}
		if err != nil {
			t.Errorf("%q as %q: a token's reader refuses it: %v", s, got, err)
		}
	}
}

// The address serve's embedded broker listens on where no --listen says
// another: the broker address's first server, 4222 where it names no port.
func TestListenOf(t *testing.T) {
	for in, want := range map[string]string{
		"tls://127.0.0.1:4222":               "127.0.0.1:4222",
		"tls://127.0.0.1":                    "127.0.0.1:4222",
		"nats://10.0.0.1:5222":               "10.0.0.1:5222",
		"tls://[fd00::1]:4222":               "[fd00::1]:4222",
		"tls://[fd00::1]":                    "[fd00::1]:4222",
		"tls://a.example:4300, tls://b:4301": "a.example:4300",
		"tls://mesh.example.org.:4222":       "mesh.example.org.:4222",
	} {
		if got := listenOf(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
