// Package tests holds the project-wide checks (import rules, package docs,
// formatting) and, in its subdirectories, the end-to-end scenarios: the
// rescue command against a real filesystem (rescue/), the benchmark
// (bench/), and, as later issues land, the lab of real machines.
package tests
