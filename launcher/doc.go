// Package launcher is what the init starts (as mesh-launch): it supervises
// the executor, counts its starts, rolls back once to the known-good copy
// kept on the node, and halts — and nothing else.
//
// The policy is decided before each start by Decide,
// a pure function of the launch state and the time:
//
//	┌─► halted? ──yes──► Idle: say so, start nothing, stay up
//	│      │no           (it polls; `mesh-launch clear` resumes it)
//	│   count this start (persisted before the child exists)
//	│      │
//	│   MaxStarts already within Window? ──no──────────► Start ─────┐
//	│      │yes                                                     │
//	│   rolled back already? ──no──► mark rolled_back, reinstall    │
//	│      │yes                      known-good ──────► Start ──────┤
//	│      │                             │failed                    │
//	│      ▼                             ▼                          │
//	│   Halt: "the machine is the problem" (then Idle)              │
//	│                                                               │
//	└── at once after a clean exit (0), after Backoff otherwise ────┘
//
// The executor calls Healthy when a reconcile has run to its end, whatever
// its outcome: it copies the running binaries into the known-good directory
// and clears the start counter and the rolled_back mark. A start is
// therefore "failed" until the executor it started says otherwise, and a
// clean exit counts like any other start: an upgrade (finish, exit 0, start
// the new binary, reconcile, Healthy) never reaches MaxStarts, while an
// executor that exits 0 at once without reconciling does.
//
// The launch state is one small JSON file in the executor's state directory
// (StateFile, see State), written atomically (temp, fsync, rename, fsync of
// the directory) and read only if it is a regular, single-named file owned
// by this user that nobody else may write. Every read-modify-write — the
// launcher counting a start, Healthy clearing the counter, Clear — holds an
// flock on a lock file beside it, so no update is lost; a plain read
// (status, the idle launcher's poll) needs no lock, since a rename is never
// seen half done. The launcher re-reads the file before every decision, so
// whoever wrote last wins, and nothing written is ever overwritten from a
// stale copy.
//
// The rollback follows the upgrade rule (STYLE 15): the rolled_back mark is
// written before the switch (a launcher killed mid-reinstall finishes it on
// its next start), it is cleared only by Healthy — once the version
// reinstalled has reconciled — and a reinstall that fails reverts the mark
// and halts rather than start something half switched. It rolls back once: if the known-good copy
// also fails MaxStarts times, the node halts, because a second failure is a
// different diagnosis.
//
// The agent's starts are supervised too (agent.go): the init runs
// `mesh-launch agent-start` as root before each, which counts them in the
// same launch state; an upgrade whose agent crash-loops sets the same
// rollback mark, which the running launcher acts on while the executor
// runs (it looks every Poll), and a release becomes known good only when
// its agent, too, has stayed up (the executor proves it: AgentProven).
//
// Out of scope: the launcher does not restart itself (the init does, and it
// never exits on its own for that reason: halted, or unable to read its
// state, it stays up idle); it never asks the init for anything; it does not
// talk to the agent but through the notice file beside its socket; it reads
// no declaration, and says two things only to the package manager (which
// version is installed, install this one: pkg.go). It deliberately does not roll back a second time, does
// not retry a failed reinstall, and does not clear a halt by itself: a
// person does, with `mesh-launch clear`.
//
// The reinstall goes through the package manager (apt, pacman, apk) when
// the known-good copy names the package version it came from, checked against
// the known-good digests; otherwise, or when that fails, it copies the
// known-good binaries back — which bypasses the package manager, whose
// database then keeps naming the version that failed. Known debt: a crash
// between the renames of a multi-binary copy can leave one binary new and
// one old (each file is whole).
package launcher
