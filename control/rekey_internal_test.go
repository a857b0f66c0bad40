package control

import "testing"

// A node's word for where it reaches the broker is taken only as the
// addresses a node's config holds: one, or a cluster's list.
func TestBrokerURLs(t *testing.T) {
	for s, want := range map[string]bool{
		"tls://10.0.0.1:4222":                       true,
		"tls://a.example:4222,tls://b.example:4222": true,
		"tls://[fd00::1]:4222":                      true,
		"":                                          false,
		"file:///etc/passwd":                        false,
		"nats://10.0.0.1:4222":                      true,
		"tls://10.0.0.1":                            true,
		"tls://a.example:4222, tls://b.example:4222": true,
		"tls://a,tls://b,tls://c":                    true,
		"tls://mesh.example.org.:4222":               true,
		"tls://user:pw@10.0.0.1:4222":                false,
		"tls://10.0.0.1:4222/x":                      false,
		"tls://10.0.0.1:4222,":                       false,
		"tls://10.0.0.1:4222,http://x:1":             false,
		"tls://10.0.0.1:abc":                         false,
		"tls://10.0.0.1:":                            false,
		" ":                                          false,
		"tls:10.0.0.1":                               false,
		"tls://10.0.0.1:0":                           false,
		"tls://10.0.0.1:70000":                       false,
		"tls://10.0.0.1:4222?x=1":                    false,
		"banana":                                     false,
	} {
		if got := checkBrokerURLs(s) == nil; got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
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
