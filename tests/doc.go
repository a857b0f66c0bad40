// Package tests holds the project-wide checks (import rules, package docs,
// formatting) and, in its subdirectories, the end-to-end scenarios: the
// rescue command against a real filesystem (rescue/), the benchmark
// (bench/), the lab of real machines (lab/, machines/), real processes end
// to end (e2e/) and the chaos run (chaos/).
package tests
