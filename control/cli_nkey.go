package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

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
//
// The key replaced is kept (FileNKeyPrevious) until serve signs in with
// the new one: broker-config reads the registry with it while the broker
// knows no other, so that the configuration it writes lets the new key in
// beside every node rather than none.
func (c *cli) nkeyRotate() error {
	// The directory first, as serve takes it: refused while a serve of
	// the embedded broker runs.
	l, err := lockDir(c.dir, "nkey rotate")
	if err != nil {
		var held *statedir.HeldError
		if errors.As(err, &held) {
			return fmt.Errorf("%w: the control NKey is made anew with every serve of the key directory stopped", err)
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
	// The keys the broker may know, kept until serve signs in with the
	// new one: broker-config reads the registry with them, to write the
	// configuration that lets the new key in with every node's. Every key
	// a rotation not finished yet replaced is kept, newest first: the
	// broker may have been given any of them.
	previous := filepath.Join(c.dir, FileNKeyPrevious)
	old, err := readKeyFile(c.dir, FileNKey)
	if err != nil {
		return err
	}
	kept, err := os.ReadFile(previous)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return statedir.ExplainAccess("read", previous, err, "")
	}
	if err := statedir.WriteBytes(previous, append(append(bytes.TrimSpace(old), '\n'), kept...), 0o600); err != nil {
		return fmt.Errorf("keeping the control NKey the broker knows: %w", err)
	}
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

// connectAsBrokerKnows connects as connect does, or, when that fails and
// keys a rotation replaced are kept (nkey rotate not finished), with each
// of them in turn: the broker knows one of them until its configuration
// is written again. Any failure but a cancel is tried so: with several
// servers, nats.go returns the last one's error, which may hide the
// refusal.
func (c *cli) connectAsBrokerKnows() (*Client, error) {
	cl, err := c.connect()
	if err == nil || errors.Is(err, context.Canceled) {
		return cl, err
	}
	kept, perr := readKeyFile(c.dir, FileNKeyPrevious)
	if perr != nil {
		return nil, err
	}
	for _, seed := range bytes.Fields(kept) {
		kp, perr := nkeys.FromSeed(seed)
		if perr != nil {
			return nil, fmt.Errorf("%s: %w", FileNKeyPrevious, perr)
		}
		prev, perr := LoadKeys(c.dir)
		if perr != nil {
			return nil, err
		}
		prev.NKey = kp
		prev.NKeyPublic, _ = kp.PublicKey()
		ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
		cl, perr := Connect(ctx, prev, c.nats, c.log)
		cancel()
		if perr == nil {
			return cl, nil
		}
	}
	return nil, err
}

// finishNKeyRotation removes the control NKey a rotation replaced, once
// serve has signed in with the new one: nothing reads it any more.
func finishNKeyRotation(k *Keys, log *slog.Logger) {
	p := filepath.Join(k.Dir, FileNKeyPrevious)
	if err := os.Remove(p); err == nil {
		statedir.SyncDir(k.Dir)
		log.Warn("the control NKey's rotation is finished: serve signs in with the new key, and the one it replaced is removed", "nkey", k.NKeyPublic)
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Error("the control NKey a rotation replaced is not removed", "file", p, "err", err)
	}
}
