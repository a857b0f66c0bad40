// Package machines proves the appliers that touch a machine's own
// databases and init on real machines: each test boots a lab (tests/lab),
// installs the real mesh-executor in it, and drives it the way a person
// at the machine would, with a root-owned declaration file and the rescue
// command, reading the result back with the machine's own tools.
package machines
