package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDecideAgent(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	p := Policy{MaxStarts: 3, Window: 10 * time.Minute}
	starts := func(n int, ago time.Duration) []time.Time {
		var ts []time.Time
		for i := 0; i < n; i++ {
			ts = append(ts, now.Add(-ago))
		}
		return ts
	}
	kg := &KnownGood{Binaries: map[string]string{"mesh-agent": "old"}}
	for _, tc := range []struct {
		name  string
		s     State
		sum   string
		want  AgentAction
		why   string // in the reason
		mark  bool   // a rollback mark set by this decision
		count int    // starts kept after it
	}{
		{"first start of a new release", State{KnownGood: kg}, "new", AgentStart, "", false, 1},
		{"third start: within the policy", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(2, time.Minute)}}, "new", AgentStart, "", false, 3},
		{"fourth: an upgrade's agent crash-loops", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(3, time.Minute)}}, "new", AgentRollback, "the agent crash-loops", true, 0},
		{"old starts are forgotten", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(3, time.Hour)}}, "new", AgentStart, "", false, 1},
		{"the known-good agent loops: no rollback", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(3, time.Minute)}}, "old", AgentLoops, "on the known-good release", false, 4},
		{"a proven agent loops: no rollback", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(3, time.Minute), Proven: "new"}}, "new", AgentLoops, "ran before", false, 4},
		{"nothing known good", State{Agent: &AgentLaunch{Starts: starts(3, time.Minute)}}, "new", AgentLoops, "nothing to roll back to", false, 4},
		{"rolled back once already", State{KnownGood: kg, RolledBack: &RollbackMark{Reinstalled: true}, Agent: &AgentLaunch{Starts: starts(3, time.Minute)}}, "new", AgentLoops, "no second rollback", false, 4},
		{"halted", State{KnownGood: kg, Halted: &Mark{}, Agent: &AgentLaunch{Starts: starts(3, time.Minute)}}, "new", AgentLoops, "halted", false, 4},
		{"an unreadable binary is not proven", State{KnownGood: kg, Agent: &AgentLaunch{Starts: starts(3, time.Minute), Proven: "new"}}, "", AgentRollback, "crash-loops", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.s.clone()
			act, next, why := DecideAgent(tc.s, now, p, tc.sum)
			if act != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("DecideAgent = %v %q, want %v (%q)", act, why, tc.want, tc.why)
			}
			if got := next.RolledBack != nil && !next.RolledBack.Reinstalled; got != tc.mark {
				t.Errorf("rollback mark set: %v, want %v (%+v)", got, tc.mark, next.RolledBack)
			}
			if len(next.Agent.Starts) != tc.count {
				t.Errorf("%d starts kept, want %d", len(next.Agent.Starts), tc.count)
			}
			if len(before.Starts) != len(tc.s.Starts) || (tc.s.Agent != nil && len(tc.s.Agent.Starts) != len(before.Agent.Starts)) {
				t.Error("DecideAgent changed its argument")
			}
		})
	}
}

// An upgrade's agent crash-loops while its executor runs: each start is
// counted by `mesh-launch agent-start` (the real binary, as the init runs
// it, exec'ing the agent after); the start past the policy marks the
// rollback; the running launcher stops the executor, reinstalls the
// known-good release — both halves — and starts it; the agent's next
// start is the known-good one, and nothing is rolled back again.
func TestAgentCrashLoopRollsBack(t *testing.T) {
	l := newLab(t)
	bin := buildMeshLaunch(t)
	agent := filepath.Join(filepath.Dir(l.installed), "mesh-agent")
	l.script(l.installed, "new", "healthy-serve", 0, "STUB_AGENT="+agent)
	l.script(filepath.Join(l.kg, "mesh-executor"), "good", "healthy-serve", 0, "STUB_AGENT="+agent)
	// The agents: the known-good one and the upgrade's, which exits at start.
	if err := os.WriteFile(filepath.Join(l.kg, "mesh-agent"), []byte("#!/bin/sh\necho good-agent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho 'new-agent: exits at start' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkDir(l.state, true); err != nil {
		t.Fatal(err)
	}
	goodAgent := sha(t, filepath.Join(l.kg, "mesh-agent"))
	if _, err := update(l.state, func(s *State) (bool, error) {
		s.KnownGood = &KnownGood{At: time.Now().UTC(), Binaries: map[string]string{"mesh-executor": sha(t, filepath.Join(l.kg, "mesh-executor")), "mesh-agent": goodAgent}}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	cfg := l.config()
	cfg.Installed = map[string]string{"mesh-executor": l.installed, "mesh-agent": agent}
	r := start(t, cfg)
	waitFor(t, "the upgrade's executor serving", 10*time.Second, func() bool { return strings.Contains(strings.Join(l.lines(), " "), "new serving") })

	// The launcher's policy is 3 starts a minute; agent-start is given the same.
	agentStart := func() string {
		t.Helper()
		c := exec.Command(bin, "agent-start", "--state", l.state, "--agent", agent, "--max-starts", "3", "--window", "1m", "--", agent)
		out, _ := c.CombinedOutput()
		return string(out)
	}
	for i := 1; i <= 3; i++ {
		if out := agentStart(); !strings.Contains(out, "new-agent: exits at start") || strings.Contains(out, "rolling back") {
			t.Fatalf("start %d: agent-start did not simply exec the agent:\n%s", i, out)
		}
	}
	if s := readState(t, l.state); s.RolledBack != nil || len(s.Agent.Starts) != 3 {
		t.Fatalf("after three starts: %+v %+v", s.RolledBack, s.Agent)
	}
	out := agentStart()
	if !strings.Contains(out, "rolling back") || !strings.Contains(out, "the agent crash-loops") || !strings.Contains(out, "new-agent: exits at start") {
		t.Fatalf("the fourth start: agent-start says\n%s", out)
	}
	defer func() {
		if t.Failed() {
			t.Logf("lines %q\nlogs:\n%s\nstate %+v", l.lines(), l.logs.String(), readState(t, l.state))
		}
	}()
	waitFor(t, "the known-good executor serving", 10*time.Second, func() bool { return strings.Contains(strings.Join(l.lines(), " "), "good serving") })
	if got := strings.Join(l.lines(), " "); got != "new serving term good serving" {
		t.Errorf("the executor's life: %q, want the upgrade's stopped, then the known-good one", got)
	}
	if rs := l.reinstalls(); len(rs) != 1 {
		t.Errorf("%d reinstalls, want one", len(rs))
	}
	if got := sha(t, agent); got != goodAgent {
		t.Error("the known-good agent was not put back")
	}
	s := readState(t, l.state)
	if s.RolledBack != nil {
		t.Errorf("the known-good executor reconciled, and the mark stays: %+v", s.RolledBack)
	}
	if s.KnownGood.Binaries["mesh-agent"] != goodAgent {
		t.Error("known good changed")
	}
	// The known-good agent starts: counted, nothing rolled back.
	if out := agentStart(); !strings.Contains(out, "good-agent") || strings.Contains(out, "rolling back") {
		t.Errorf("the known-good agent's start:\n%s", out)
	}
	if !strings.Contains(l.logs.String(), "a rollback was asked for while the executor runs") {
		t.Errorf("the launcher does not say why it stopped the executor:\n%s", l.logs.String())
	}
	r.stop(5 * time.Second)
}

// Healthy after an upgrade whose executor reconciled: while the agent
// beside it has not stayed up, the release is not known good (the copy
// and the record stay the old release's); an unfinished rollback mark is
// left for the launcher. Once the agent is proven, Healthy keeps both.
func TestHealthyWaitsForTheAgent(t *testing.T) {
	l := newLab(t)
	if err := checkDir(l.state, true); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(l.dir, "bin", "mesh-executor")
	agent := filepath.Join(l.dir, "bin", "mesh-agent")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(exe, "executor 1")
	write(agent, "agent 1")
	bins := map[string]string{"mesh-executor": exe, "mesh-agent": agent}
	if err := Healthy(l.state, bins); err != nil {
		t.Fatal(err)
	}
	first := readState(t, l.state).KnownGood
	if first == nil || first.Binaries["mesh-agent"] != sha(t, agent) {
		t.Fatalf("the first release is not known good: %+v", first)
	}

	write(exe, "executor 2")
	write(agent, "agent 2")
	if _, err := update(l.state, func(s *State) (bool, error) {
		s.Starts = []time.Time{time.Now().UTC()}
		s.RolledBack = &RollbackMark{At: time.Now().UTC(), Reason: "the agent crash-loops"}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := Healthy(l.state, bins); err != nil {
		t.Fatal(err)
	}
	s := readState(t, l.state)
	if s.KnownGood.Binaries["mesh-agent"] != first.Binaries["mesh-agent"] || s.KnownGood.Binaries["mesh-executor"] != first.Binaries["mesh-executor"] {
		t.Errorf("an unproven agent's release became known good: %+v", s.KnownGood)
	}
	if b, _ := os.ReadFile(filepath.Join(l.state, KnownGoodDir, "mesh-agent")); string(b) != "agent 1" {
		t.Errorf("the known-good agent copy is %q", b)
	}
	if len(s.Starts) != 0 || s.RolledBack == nil {
		t.Errorf("Healthy: starts %v (want cleared), rollback mark %+v (want kept: not acted on yet)", s.Starts, s.RolledBack)
	}

	if err := AgentProven(l.state, sha(t, agent)); err != nil {
		t.Fatal(err)
	}
	if err := Healthy(l.state, bins); err != nil {
		t.Fatal(err)
	}
	s = readState(t, l.state)
	if s.KnownGood.Binaries["mesh-agent"] != sha(t, agent) || s.KnownGood.Binaries["mesh-executor"] != sha(t, exe) {
		t.Errorf("the proven release is not known good: %+v", s.KnownGood)
	}
	if b, _ := os.ReadFile(filepath.Join(l.state, KnownGoodDir, "mesh-agent")); string(b) != "agent 2" {
		t.Errorf("the known-good agent copy is %q", b)
	}
}

// apk's "NAME-VERSION[ - DESCRIPTION]" line, as `apk info -e -v -v`
// prints it (the description left out where /etc/apk/config says quiet).
func TestApkVersion(t *testing.T) {
	for out, want := range map[string]string{
		"nox-mesh-host-0.9.2-r1\n":                           "0.9.2-r1",
		"nox-mesh-host-0.9.2-r1 - node host of a nox mesh\n": "0.9.2-r1",
		"nox-mesh-host-1.0_rc1-r0":                           "1.0_rc1-r0",
		"":                                                   "",
		"nox-mesh-hostile-0.1-r0\n":                          "",
		"WARNING: something\nfoo\n":                          "",
		"nox-mesh-host-0.9.2-r1 x86":                         "",
	} {
		if got := apkVersion(out); got != want {
			t.Errorf("apkVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

// An agent's binary that cannot be read (a release that lost it, or a
// --agent a person mistyped) is counted as a start of a broken release,
// and the decision says the binary could not be read.
func TestAnAgentBinaryThatCannotBeReadIsSaid(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := checkDir(state, true); err != nil {
		t.Fatal(err)
	}
	if _, err := update(state, func(s *State) (bool, error) {
		s.KnownGood = &KnownGood{At: time.Now().UTC(), Binaries: map[string]string{"mesh-agent": "aa"}}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-such-agent")
	p := Policy{MaxStarts: 1, Window: time.Minute}
	var act AgentAction
	var why string
	for range 2 {
		var err error
		if act, why, err = AgentStarting(state, missing, p); err != nil {
			t.Fatal(err)
		}
	}
	if act != AgentRollback || !strings.Contains(why, "the agent's binary "+missing+" could not be read") {
		t.Fatalf("%v: %s", act, why)
	}
}
