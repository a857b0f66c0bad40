// Package overlay is the executor's WireGuard backend: its own private
// key, the interface in the kernel or under a userspace wireguard-go run by
// the init, and its configuration written and read back through wgctrl.
//
// The private key is the executor's own. It is made once — at enrolment, or
// on the first overlay apply of a host that is not enrolled — and kept in
// the executor's state directory (root, 0600). It never appears in a
// declaration, a report or a log. Beside it, wireguard.pub holds the public
// half, for what reports it upward (the profile and inventory, later) and
// for the tests, which read it without asking the executor.
package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyFile and PubFile are the key's files in the executor's state
// directory.
const (
	KeyFile = "wireguard.key"
	PubFile = "wireguard.pub"
)

// LoadKey reads the executor's private key from dir. ok is false when there
// is none yet. A key file that is not a regular root-only file of the
// executor's is refused rather than used: whoever could write it could
// choose the node's identity on the overlay.
func LoadKey(dir string) (k wgtypes.Key, ok bool, err error) {
	p := filepath.Join(dir, KeyFile)
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return k, false, nil
	}
	if err != nil {
		return k, false, fmt.Errorf("the executor's WireGuard key %s: %w", p, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return k, false, err
	}
	st, _ := info.Sys().(*syscall.Stat_t)
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o077 != 0 || st == nil || int(st.Uid) != os.Geteuid() || st.Nlink != 1 {
		return k, false, fmt.Errorf("the executor's WireGuard key %s is not a regular file readable only by its owner, the executor (%v); not used", p, info.Mode())
	}
	b := make([]byte, 128)
	n, _ := f.Read(b)
	k, err = wgtypes.ParseKey(strings.TrimSpace(string(b[:n])))
	if err != nil {
		return k, false, fmt.Errorf("the executor's WireGuard key %s does not hold a key", p)
	}
	return k, true, nil
}

// EnsureKey returns the executor's private key, making it (and its public
// half beside it) when there is none. made says it was made now. The
// public file is written again whenever it does not match.
func EnsureKey(dir string) (k wgtypes.Key, made bool, err error) {
	k, ok, err := LoadKey(dir)
	if err != nil {
		return k, false, err
	}
	if !ok {
		if k, err = wgtypes.GeneratePrivateKey(); err != nil {
			return k, false, err
		}
		if err := writeDurably(dir, KeyFile, []byte(k.String()+"\n"), 0o600); err != nil {
			return k, false, fmt.Errorf("keep the executor's WireGuard key: %w", err)
		}
		made = true
	}
	pub := []byte(k.PublicKey().String() + "\n")
	if cur, err := os.ReadFile(filepath.Join(dir, PubFile)); err != nil || string(cur) != string(pub) {
		if err := writeDurably(dir, PubFile, pub, 0o644); err != nil {
			return k, made, fmt.Errorf("write the WireGuard public key: %w", err)
		}
	}
	return k, made, nil
}

// SaveKey makes k the executor's private key (and its public half beside
// it), durably: a rekey's new key, once the grant that names it is
// accepted.
func SaveKey(dir string, k wgtypes.Key) error {
	if err := writeDurably(dir, KeyFile, []byte(k.String()+"\n"), 0o600); err != nil {
		return fmt.Errorf("keep the executor's WireGuard key: %w", err)
	}
	if err := writeDurably(dir, PubFile, []byte(k.PublicKey().String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the WireGuard public key: %w", err)
	}
	return nil
}

// writeDurably writes name in dir through a new temporary file, synced,
// renamed over it, and the directory synced.
func writeDurably(dir, name string, data []byte, mode os.FileMode) error {
	tmp := filepath.Join(dir, "."+name+".new")
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err == nil {
		_, err = f.Write(data)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, filepath.Join(dir, name))
		}
		if err != nil {
			os.Remove(tmp)
			return err
		}
	} else {
		f.Close()
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
