// Package lab boots disposable lab machines for tests: a real init (systemd,
// OpenRC, runit or s6) as PID 1 in fresh pid, mount, uts, ipc, net and cgroup
// namespaces, on an overlay of the host's root whose upper layer is a tmpfs,
// entered with pivot_root. What a test does in a lab stays in the lab:
//
//   - every mount is made in the lab's private mount namespace (propagation
//     private before the first one), so the host's mountinfo never shows one;
//   - writes land in the tmpfs upper layer, which only that namespace sees;
//   - /proc/sys is read-only except /proc/sys/net (per network namespace),
//     /proc/sysrq-trigger (where the kernel has it), /proc/irq, /proc/bus
//     and /proc/fs are read-only, sysfs is read-only, /dev is a tmpfs
//     with a handful of harmless nodes and its own devpts;
//   - the lab has its own network namespace, with nothing but lo until Link
//     adds a veth pair to another lab; the host's namespace is never touched;
//   - /run and /tmp are fresh tmpfs, /etc/hostname (the lab's name) and
//     /etc/machine-id are the lab's own.
//
// The lab's PID 1 is started from Go with clone flags for the new namespaces,
// straight into its own cgroup2 directory (CLONE_INTO_CGROUP) under
// <cgroup2 mount>/nox-lab/, with Pdeathsig SIGKILL on a thread kept for the
// lab's lifetime: if the test binary dies, so does the lab (its pid namespace
// dies with its PID 1). The inner stage, which makes the mounts and calls
// pivot_root before it execs the init, is this same test binary re-executed
// with an environment variable that this package's init function looks for,
// so any test binary that imports lab can boot labs without a helper program
// (the init functions of packages initialised before lab run there too).
//
// Teardown kills the whole cgroup (cgroup.kill) and PID 1, waits until the
// cgroup is empty, removes the cgroup subtree the init made, and removes the
// scratch directory; the lab's mounts, namespaces and veth ends go with its
// last process. Boot registers it with t.Cleanup, so a failing or panicking
// test tears its labs down too, and the first Boot of a process removes what
// a killed test binary left (cgroup and scratch directories named after a pid
// that no longer runs).
//
// At most two labs run at once in one process; a third Boot waits for a slot.
// A test that needs two labs at once must therefore not run in parallel with
// another test that holds one and waits for a second.
package lab
