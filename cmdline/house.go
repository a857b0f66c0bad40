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
