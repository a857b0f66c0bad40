package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A node's disks. The executor's state is on a disk of its own, small,
// so that the run can fill it; the tree (what the mesh writes, and the
// host's files beside it) and the agent's state are on the node's system
// disk. With a loop device each is an ext4 image, as the control side's
// is, so that the node's power can be cut: both images copied at one
// instant, with every process of the node stopped, are what its disks
// held when the power went. Without one the state is a tmpfs, the system
// disk a directory of the run's, and no node's power is cut.

const (
	nodeStateSize = 64 << 20
	nodeSysSize   = 32 << 20
)

// nodeDisks makes n's two disks and mounts them.
func (w *world) nodeDisks(n *node) error {
	for _, d := range []string{n.state, n.sys} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if !w.loop {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", n.state).CombinedOutput(); err != nil {
			return fmt.Errorf("a tmpfs for %s's state: %v %s", n.name, err, out)
		}
		w.cleanup = append(w.cleanup, func() { exec.Command("umount", "-l", n.state).Run() })
		return nil
	}
	n.stateImg = filepath.Join(n.base, "state.img")
	n.sysImg = filepath.Join(n.base, "sys.img")
	for _, d := range []struct {
		img, dir string
		size     int64
	}{{n.stateImg, n.state, nodeStateSize}, {n.sysImg, n.sys, nodeSysSize}} {
		if err := makeImage(d.img, d.size); err != nil {
			return err
		}
		if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", d.img, d.dir).CombinedOutput(); err != nil {
			return fmt.Errorf("mount %s on %s: %v\n%s", d.img, d.dir, err, out)
		}
		dir := d.dir
		// Whatever is mounted there by then (a power cut mounts a copy)
		// is unmounted at the end, after every process is ended.
		w.cleanup = append(w.cleanup, func() {
			if err := exec.Command("umount", dir).Run(); err != nil {
				exec.Command("umount", "-l", dir).Run()
			}
		})
	}
	return os.Chmod(n.state, 0o700)
}

// makeImage makes an ext4 image of size bytes at img, with no blocks
// reserved for root: the executor runs as root, and a disk is full for it
// when it is full for the filler.
func makeImage(img string, size int64) error {
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(img, size); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v\n%s", err, out)
	}
	return nil
}

// nodeProcs is every process of n's machine: its agent, and whatever
// runs in its network namespace (the launcher, the executor, the overlay's
// wireguard-go).
func (w *world) nodeProcs(n *node) []int {
	pids := netnsPids(n)
	if n.agentP != nil && n.agentP.running() {
		pids = append(pids, n.agentP.cmd.Process.Pid)
	}
	return pids
}

// nodeCut cuts n's power: every process of the node is stopped (SIGSTOP,
// so that nothing more reaches its disks after the instant of the cut),
// both disk images copied as they are, every process killed; then the
// machine boots: what lived in memory is gone (the overlay's interface
// and its wireguard-go, the firewall's rules, /run), the host's firewall
// is loaded again as its own service loads it at boot, the copies are
// mounted in place of the disks (ext4 replays its journals), and the
// launcher and the agent are started as the init starts them. What the
// node recorded and reported before the cut must hold after it: the
// invariants after the step say so.
func (w *world) nodeCut(n *node) {
	pids := w.nodeProcs(n)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	w.cuts++
	stateCut := filepath.Join(n.base, fmt.Sprintf("state-cut%d.img", w.cuts))
	sysCut := filepath.Join(n.base, fmt.Sprintf("sys-cut%d.img", w.cuts))
	err := copyFile(n.stateImg, stateCut)
	if err == nil {
		err = copyFile(n.sysImg, sysCut)
	}
	for _, p := range []*proc{n.exec, n.agentP} {
		if p != nil && p.running() {
			p.expected = true
		}
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range []*proc{n.exec, n.agentP} {
		if p != nil {
			p.stopped, p.stoppedPid = false, 0
			select {
			case <-p.ended:
			case <-time.After(20 * time.Second):
				w.violate(n, "node-power-cut", "%s: %s had not ended 20s after kill -9", n.name, p.name)
			}
		}
	}
	// Nothing of the node lives on: a child that was between its fork
	// and its namespace (none should be) is killed as found.
	w.eventually(20*time.Second, func() bool {
		left := w.nodeProcs(n)
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(left) == 0
	})
	if err != nil {
		w.violate(n, "node-power-cut", "copying %s's disks: %v", n.name, err)
		w.startExecutor(n)
		w.startAgent(n)
		return
	}
	// The boot: memory's state gone.
	if err := w.bootNetns(n); err != nil {
		w.violate(n, "node-power-cut", "%s's boot: %v", n.name, err)
	}
	for _, d := range []struct {
		img  *string
		cut  string
		dir  string
		name string
	}{{&n.stateImg, stateCut, n.state, "state"}, {&n.sysImg, sysCut, n.sys, "system"}} {
		var out []byte
		if !w.eventually(20*time.Second, func() bool {
			out, err = exec.Command("umount", d.dir).CombinedOutput()
			return err == nil
		}) {
			w.violate(n, "node-power-cut", "umount %s's %s disk (%s): %v\n%s", n.name, d.name, d.dir, err, out)
			return
		}
		if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", d.cut, d.dir).CombinedOutput(); err != nil {
			w.violate(n, "node-power-cut", "mounting the %s disk %s's cut left (%s) on %s: %v\n%s", d.name, n.name, d.cut, d.dir, err, out)
			return
		}
		os.Remove(*d.img)
		*d.img = d.cut
	}
	var logFrom int64
	if fi, err := os.Stat(n.exec.log); err == nil {
		logFrom = fi.Size()
	}
	w.startExecutor(n)
	w.startAgent(n)
	w.checkBootRepairs(n, logFrom)
}

// checkBootRepairs: what the executor's start put back after the cut
// (its log says each repair) is only what the boot took from memory —
// the firewall's rules, the overlay's interface. A file, a directory, a
// block, a key or an archive's path it had to put back is one its store
// recorded done before the disk held it: the store claimed more than
// happened.
func (w *world) checkBootRepairs(n *node, from int64) {
	var lines []string
	read := func() {
		lines = nil
		f, err := os.Open(n.exec.log)
		if err != nil {
			return
		}
		defer f.Close()
		if _, err := f.Seek(from, io.SeekStart); err != nil {
			return
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
	}
	// The socket is there before the start's reconcile ends (it is
	// served after): its end is in the log.
	if !w.eventually(60*time.Second, func() bool {
		read()
		for _, l := range lines {
			if strings.Contains(l, "msg=reconciled trigger=start ") {
				return true
			}
		}
		return false
	}) {
		w.violate(n, "node-power-cut", "%s: no start reconcile in its executor's log within 60s of its boot", n.name)
	}
	for _, l := range lines {
		if !strings.Contains(l, `msg="repaired: `) || !strings.Contains(l, " trigger=start ") {
			continue
		}
		typ := ""
		if _, rest, ok := strings.Cut(l, " type="); ok {
			typ, _, _ = strings.Cut(rest, " ")
		}
		if typ != "opening" && typ != "overlay" {
			w.violate(n, "node-power-cut", "%s: after its power cut the executor's start repaired what its store had recorded on disk (a %s): %s", n.name, typ, l)
		}
	}
}

// reloadFirewall loads n's firewall again as its own service does: the
// ruleset flushed, the host's rules loaded; the mesh's gone with them.
func reloadFirewall(n *node) error {
	c, done, err := nftIn(n)
	if err != nil {
		return err
	}
	c.FlushRuleset()
	err = c.Flush()
	done()
	if err != nil {
		return fmt.Errorf("flushing the firewall: %w", err)
	}
	if err := setupFirewall(n); err != nil {
		return fmt.Errorf("the host's firewall: %w", err)
	}
	return nil
}

// bootNetns gives n's network namespace what a boot leaves: no mesh
// interface and no rule but the host's, loaded again; and an empty /run
// (the wireguard directory, the executor's socket).
func (w *world) bootNetns(n *node) error {
	if err := reloadFirewall(n); err != nil {
		return err
	}
	for _, dir := range []string{n.wg, filepath.Dir(n.sock)} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}
