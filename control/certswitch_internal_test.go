package control

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
)

// A switch of the broker's certificate cut off between its key's rename
// and its certificate's is finished as serve starts: the certificate
// follows the key, and a pair that matches is left alone.
func TestACertSwitchCutOffIsFinished(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, nil, ""); err != nil {
		t.Fatal(err)
	}
	if done, err := FinishCertSwitch(dir); done || err != nil {
		t.Fatalf("nothing announced: %v %v", done, err)
	}
	certPEM, keyPEM, err := brokerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, FileBrokerCert), filepath.Join(dir, FileBrokerKey)
	os.WriteFile(cert+".next", certPEM, 0o644)
	os.WriteFile(key+".next", keyPEM, 0o600)
	if done, err := FinishCertSwitch(dir); done || err != nil {
		t.Fatalf("announced, not switched: %v %v", done, err)
	}
	want, _ := certFingerprint(cert + ".next")
	os.Rename(key+".next", key) // the switch, cut off after its first rename
	if _, err := tls.LoadX509KeyPair(cert, key); err == nil {
		t.Fatal("the cut-off pair matches")
	}
	if done, err := FinishCertSwitch(dir); !done || err != nil {
		t.Fatalf("the cut-off switch: %v %v", done, err)
	}
	if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
		t.Fatal(err)
	}
	if got, _ := certFingerprint(cert); got != want {
		t.Fatalf("the certificate in place is %s, want the announced %s", got, want)
	}
	if done, _ := FinishCertSwitch(dir); done {
		t.Fatal("finished twice")
	}
}
