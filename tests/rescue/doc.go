// Package rescue holds end-to-end tests of the rescue command,
// `mesh-executor apply|plan|owned FILE`, driven as a real binary, as root,
// against a real filesystem. It has no code of its own; the tests prove two
// of the executor's claims (SECURITY.md) from the outside:
//
//   - crash_test.go: the store tells the truth after kill -9 at any instant.
//     An apply of a thousand files, a re-apply with changed content, and an
//     owns_nothing removal are each killed at random moments; the next apply
//     converges, the one after changes nothing, `owned` agrees with the
//     machine, and undeclaring everything gives the machine back exactly:
//     what the host created is gone (a crash never turned the host's own
//     creation into a "found" thing), what it found has its original back
//     byte for byte with its mode and owner, and what it was never told
//     about is untouched.
//
//   - hostile_test.go: a hostile local user (uid 65534, acting in a child
//     process) who owns a directory the declaration writes into cannot
//     steer a root write, a read of an "original", or a removal with a
//     symlink, a hardlink or a FIFO, planted before an apply, between two
//     applies, or swapped in and out while an apply runs.
package rescue
