// Package shapes is the declaration vocabulary of nox-mesh-host: the v1
// declaration, its eleven resource shapes, strict decoding, validation, the
// protected set, and the report vocabulary the executor answers with.
//
// It is pure data. It never touches the machine: no os/exec, no syscalls, no
// file reads. Where a check needs the machine (resolving a symlinked path, say)
// the caller passes a function in; the executor passes a real one, tests pass
// a fake.
//
// Two entry points, and the safe one is the default:
//
//   - Parse decodes what arrives over the link. It refuses an `action`,
//     because the link may never carry a command to run.
//   - ParseTrusted decodes a local file named by root, or the carried bundle.
//     It permits an `action`: whoever can write that file and run the
//     executor as root can already do anything an action could.
//
// Unknown is refused, never skipped: an unknown version, type or field
// refuses the whole declaration, and the error names the resource and the
// field. A host that skipped what it did not understand would apply most of a
// declaration and report success.
package shapes
