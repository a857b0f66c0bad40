package control

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nats-io/nkeys"
	"github.com/nox-mesh/nox-mesh-host/statedir"
)

// nkeyRotate makes the control NKey (control.nk) anew: the credential
// with which serve and the commands sign in to the embedded broker, or to
// an existing broker configured from a file. nats.go signs in with one
// NKey for a connection's whole life, reconnections included, so a serve
// cannot move to a new key under way: the rotation is made with every
// serve of the key directory stopped, and each signs in with the new key
// when started again. The embedded broker lets in the key its serve
// loads; a broker configured from a file lets it in once the
// configuration broker-config writes again is loaded, and cuts the old
// one's connections at that reload. In operator mode there is no such
// key: serve and every command sign in with a key of their own each,
// whose JWT the control side's signing key issues (account-key rotate).
func (c *cli) nkeyRotate() error {
	// The directory first, as serve takes it: refused while a serve of
	// the embedded broker runs.
	l, err := lockDir(c.dir, "nkey rotate")
	if err != nil {
		var held *statedir.HeldError
		if errors.As(err, &held) {
			return fmt.Errorf("%w: stop serve first; the control NKey is made anew with every serve of the key directory stopped", err)
		}
		return err
	}
	defer l.Close()
	k, err := LoadKeys(c.dir)
	if err != nil {
		return err
	}
	if k.Operator != nil {
		return errors.New("the key directory is in operator mode (broker-config --resolver): serve and the commands sign in there with a key of their own each, never control.nk; rotate the control side's signing key that issues their JWTs with mesh-control account-key rotate")
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	if err := statedir.WriteBytes(filepath.Join(c.dir, FileNKey), append(seed, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the new control NKey: %w", err)
	}
	if c.json {
		return c.printJSON(map[string]string{"previous": k.NKeyPublic, "current": pub})
	}
	fmt.Fprintf(c.stdout, "the control NKey is %s now (it was %s): serve and the commands sign in with it from their next start\n", pub, k.NKeyPublic)
	fmt.Fprintf(c.stderr, "the embedded broker lets it in when serve starts; an existing broker configured from a file lets it in once its configuration is written again and loaded, and then cuts the old key's connections\n")
	c.next("mesh-control serve" + c.dirFlag() + "    # the embedded broker; or, for an existing broker: mesh-control broker-config" + c.dirFlag() + " --listen HOST:PORT > FILE (a cluster: --cluster ... --out DIR), reload each server, then serve --nats URL")
	return nil
}
