package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The control side's disk. Its directory (the keys, the registry, the
// broker's JetStream store) is on a filesystem of its own from the start
// of the run, so that the run can do to it what a machine's disk does:
// fill up, and lose power. With a loop device it is an ext4 image, as in
// the power-cut test of tests/e2e: a copy of the image file taken while
// serve runs is what a power cut leaves, only what reached the block
// device, and mounting the copy replays ext4's journal as a boot would.
// Without one it is a tmpfs, which can fill up but not be cut.

// ctlImageSize is the control side's disk: room for a long run's reports,
// small enough to fill and copy in a second.
const ctlImageSize = 256 << 20

// diskFullSays is what a command that could not write says while the
// control side's disk is full (serve says which disk: control/store.go).
const diskFullSays = "the disk holding "

// loopAvailable says whether the control side can be put on an ext4
// image through a loop device, and if not, why.
func loopAvailable() (bool, string) {
	if out, err := exec.Command("losetup", "-f").CombinedOutput(); err != nil {
		return false, fmt.Sprintf("no free loop device (losetup -f: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return false, fmt.Sprintf("no mkfs.ext4: %v", err)
	}
	return true, ""
}

// moveControl moves the control directory, as init left it, onto a
// filesystem of its own mounted in its place: an ext4 image (w.img) with
// a loop device, a tmpfs without.
func (w *world) moveControl() error {
	initial := w.ctl + ".init"
	if err := os.Rename(w.ctl, initial); err != nil {
		return err
	}
	if err := os.Mkdir(w.ctl, 0o700); err != nil {
		return err
	}
	if w.loop {
		w.img = filepath.Join(w.base, "control.img")
		if err := makeImage(w.img, ctlImageSize); err != nil {
			return err
		}
		if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", w.img, w.ctl).CombinedOutput(); err != nil {
			return fmt.Errorf("mount %s on %s: %v\n%s", w.img, w.ctl, err, out)
		}
	} else {
		opt := fmt.Sprintf("size=%d,mode=0700", ctlImageSize)
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opt, "tmpfs", w.ctl).CombinedOutput(); err != nil {
			return fmt.Errorf("a tmpfs for the control side: %v\n%s", err, out)
		}
	}
	// Whatever is mounted there by then (a power cut mounts another
	// image) is unmounted at the end, after every process is ended.
	w.cleanup = append(w.cleanup, func() {
		if err := exec.Command("umount", w.ctl).Run(); err != nil {
			exec.Command("umount", "-l", w.ctl).Run()
		}
	})
	if out, err := exec.Command("cp", "-a", initial+"/.", w.ctl).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v\n%s", err, out)
	}
	os.RemoveAll(initial)
	w.ctlFiller = filepath.Join(w.ctl, "zz-filler")
	// What init wrote is on the disk before the run begins, as it would be
	// long before any power cut.
	return syncfs(w.ctl)
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// powerCut cuts the control side's power: serve is stopped (SIGSTOP, so
// that it acknowledges nothing after the instant of the cut), the image
// file is copied as it is (what ext4 had handed to the block device, no
// more), serve is killed, the original unmounted and the copy mounted in
// its place (ext4 replays its journal), and serve started on it.
// Everything acknowledged before the step must be there after it: the
// invariants after the step say so.
func (w *world) powerCut() {
	w.cuts++
	cut := filepath.Join(w.base, fmt.Sprintf("control-cut%d.img", w.cuts))
	w.serve.cmd.Process.Signal(syscall.SIGSTOP)
	w.serve.stopped = true
	err := copyFile(w.img, cut)
	w.end(w.serve, syscall.SIGKILL)
	if err != nil {
		w.violate(nil, "power-cut", "copying the control side's image: %v", err)
		w.startServe()
		return
	}
	// The original is unmounted once nothing holds it (a client command
	// that just ended may still be closing its files).
	var out []byte
	if !w.eventually(20*time.Second, func() bool {
		out, err = exec.Command("umount", w.ctl).CombinedOutput()
		return err == nil
	}) {
		w.violate(nil, "power-cut", "umount %s: %v\n%s", w.ctl, err, out)
		w.startServe()
		return
	}
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", cut, w.ctl).CombinedOutput(); err != nil {
		w.violate(nil, "power-cut", "mounting the image the cut left (%s) on %s: %v\n%s", cut, w.ctl, err, out)
		return
	}
	os.Remove(w.img)
	w.img = cut
	w.startServe()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// fillUp appends to path until the filesystem holding it has not a byte
// left: in ever smaller writes, so that the last block's tail is taken
// too.
func fillUp(path string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
	}
}

// refusedFull checks a command that writes, run while the control side's
// disk is full: it must fail, saying the disk is full (or another reason
// in also, separated by "|", for a command refused before it writes). It
// says whether the command was refused; one that was not has a violation
// said and goes on to be counted as the acknowledged write it was.
func (w *world) refusedFull(n *node, what, out string, code int, err error, also string) bool {
	w.check("refused-legibly")
	if err == nil && code == 0 {
		// Taken: the broker wrote into room its files had (a stream's
		// block is allocated ahead), and fsynced it before answering. It
		// is acknowledged like any write, and held to it.
		return false
	}
	said := strings.Contains(out, diskFullSays) && strings.Contains(out, " is full")
	for _, why := range strings.Split(also, "|") {
		said = said || (why != "" && strings.Contains(out, why))
	}
	if err != nil || !said {
		w.violate(n, "refused-legibly", "%s on a full control disk: expected a refusal saying %q, got exit %d %v:\n%s", what, diskFullSays+"… is full", code, err, out)
	}
	return true
}

// ctlFree frees the control side's disk; serve must take writes again
// without a restart, within a bound: a token issued (for a machine that
// never comes) is the write it is asked.
func (w *world) ctlFree() {
	if err := os.Remove(w.ctlFiller); err != nil && !errors.Is(err, os.ErrNotExist) {
		w.violate(nil, "writes-again", "removing the filler: %v", err)
	}
	w.ctlFull = false
	// Serve opens the store anew when its next look finds room, which
	// may be after a write was taken already (a stream that held no
	// error takes writes at once): two steps more.
	w.reopenUntil = w.stepN + 2
	w.check("writes-again")
	var out string
	var code int
	var err error
	start := time.Now()
	ok := w.eventually(60*time.Second, func() bool {
		w.spares++
		out, code, err = w.control("token", "issue", "--new", "--name", fmt.Sprintf("spare%d", w.spares))
		return err == nil && code == 0
	})
	if !ok {
		w.violate(nil, "writes-again", "serve took no write within 60s of the control side's disk having room again: token issue: exit %d %v\n%s", code, err, out)
		return
	}
	w.logf("  serve takes writes again after %s", time.Since(start).Round(100*time.Millisecond))
}
