package cmdline

// housePrograms are the programs nox-mesh-host ships, each with its
// manual's section: each manual's SEE ALSO names the others.
var housePrograms = []struct {
	name    string
	section int
}{
	{"mesh-control", 1},
	{"mesh-executor", 8},
	{"mesh-launch", 8},
	{"mesh-agent", 8},
}

// houseSections are the manual sections of the node's programs that no
// flag says — what their exit statuses mean, the environment they read,
// the files beyond their flags' defaults, examples — where the program's
// own Program leaves them empty. They sit beside the generator because
// the three programs' packages (agent, executor/cli, launcher) define
// their commands and nothing more; a Program that sets a section says it
// itself, and this entry's is not used.
var houseSections = map[string]Program{
	"mesh-executor": {
		ExitStatus: []Entry{
			{"0", "done: applied, or nothing to do; a read-only command answered; --help"},
			{"1", "failed: the apply ran and a step failed, or doctor found a check failing"},
			{"2", "refused whole, nothing touched: a declaration refused before any step, a command run as a user that is not root where root is needed, or a command line it does not take"},
		},
		Environment: []Entry{
			{"", "mesh-executor reads no environment variable: what it does is its flags, its state directory and what the control plane signed. The init's environment is not passed on to what it runs."},
		},
		Files: []Entry{
			{"/usr/lib/nox-mesh-host/foundation.lock", "the carried bundle the packages ship: reconcile applies it, and no other unless given one (a build stamped with its digest takes no other)"},
		},
		Examples: []Entry{
			{"mesh-executor doctor", "check the state directory, the daemon, the identity, the agent and the broker, a line each with what to do when it fails"},
			{"mesh-executor plan rescue.json", "say what applying the local declaration rescue.json would do, with content diffs, touching nothing"},
			{"mesh-executor apply rescue.json", "apply it (rescue, when the control side cannot be reached)"},
			{"mesh-executor enrol < token", "enrol this machine with a token read on standard input"},
			{"mesh-executor reconcile", "apply the carried bundle: raise the control side on a mesh's first node"},
		},
	},
	"mesh-launch": {
		ExitStatus: []Entry{
			{"0", "the launcher stopped on SIGTERM or SIGINT; status, clear and agent-start done; --help"},
			{"1", "another mesh-launch holds the state directory (it is named by pid), or status or clear failed"},
			{"2", "a command line it does not take"},
		},
		Environment: []Entry{
			{"", "mesh-launch reads no environment variable: its flags say what it starts, and the executor is started with the arguments given after --."},
		},
		Examples: []Entry{
			{"mesh-launch --state /var/lib/mesh-host/executor -- serve --state /var/lib/mesh-host/executor --socket /run/mesh-host/executor.sock --agent-user mesh-agent", "what the packages' init runs: supervise the executor's daemon"},
			{"mesh-launch status", "recent starts, whether it rolled back or halted and why, the agent's starts"},
			{"mesh-launch clear", "clear a halt once the machine is mended; the running launcher resumes within seconds"},
		},
	},
	"mesh-agent": {
		ExitStatus: []Entry{
			{"0", "the agent stopped on SIGTERM or SIGINT; --help, --version"},
			{"1", "it could not start or run: its identity unreadable, its state directory held by another agent or not writable, its user not found to drop to"},
			{"2", "a command line it does not take"},
		},
		Environment: []Entry{
			{"", "mesh-agent reads no environment variable: its identity is its configuration file, its settings are its flags."},
		},
		Examples: []Entry{
			{"mesh-agent --config /var/lib/mesh-host/agent/config.json --state /var/lib/mesh-host/agent --socket /run/mesh-host/executor.sock --user mesh-agent", "what the packages' init runs (through mesh-launch agent-start): the agent as root drops to mesh-agent before it dials"},
			{"mesh-agent --version", "its version and build, which must be the executor's"},
		},
	},
}
