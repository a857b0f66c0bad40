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
		"nats://10.0.0.1:4222":                      false,
		"tls://10.0.0.1":                            false,
		"tls://user:pw@10.0.0.1:4222":               false,
		"tls://10.0.0.1:4222/x":                     false,
		"tls://10.0.0.1:4222,":                      false,
		"tls://10.0.0.1:4222,http://x:1":            false,
		"tls://10.0.0.1:abc":                        false,
		"tls://10.0.0.1:0":                          false,
		"tls://10.0.0.1:70000":                      false,
		"tls://10.0.0.1:4222?x=1":                   false,
		"banana":                                    false,
	} {
		if got := checkBrokerURLs(s) == nil; got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
		}
	}
}
