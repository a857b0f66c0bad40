package command

import "testing"

// wireguardBanner is what wireguard-go v0.0.20220316 prints to standard
// error before it gives up, byte for byte (captured running it twice on
// one interface name).
const wireguardBanner = `┌──────────────────────────────────────────────────────┐
│                                                      │
│   Running wireguard-go is not required because this  │
│   kernel has first class support for WireGuard. For  │
│   information on installing the kernel module,       │
│   please visit:                                      │
│         https://www.wireguard.com/install/           │
│                                                      │
└──────────────────────────────────────────────────────┘`

func TestErrorLine(t *testing.T) {
	for _, tc := range []struct {
		name, stdout, stderr, want string
	}{
		{"wireguard-go, its UAPI socket taken (another namespace, the same name)",
			"ERROR: (wg0) 2026/12/02 23:51:01 UAPI listen error: unix socket in use", wireguardBanner,
			"ERROR: (wg0) 2026/12/02 23:51:01 UAPI listen error: unix socket in use"},
		{"wireguard-go, its TUN device taken (the same namespace)",
			"ERROR: (wg0) 2026/12/02 23:50:57 Failed to create TUN device: device or resource busy", wireguardBanner,
			"ERROR: (wg0) 2026/12/02 23:50:57 Failed to create TUN device: device or resource busy"},
		{"nothing but a box: its last line, for want of better", "", wireguardBanner,
			"└──────────────────────────────────────────────────────┘"},
		{"an error word in any case", "", "usage: tool [flags]\nE: Unable to locate package nope\nsee tool(8)",
			"E: Unable to locate package nope"},
		{"the first line that says an error: the cause before its consequences", "",
			"fatal: could not read config\nerror: giving up", "fatal: could not read config"},
		{"standard error before standard output", "warning: failed once, retried", "useradd: cannot lock /etc/passwd; try again later.",
			"useradd: cannot lock /etc/passwd; try again later."},
		{"no error word: the last line that is not decoration", "", "something odd happened\n----------\n",
			"something odd happened"},
		{"no error word, only output on standard output", "half done\nstopped here", "", "stopped here"},
		{"a rule of dashes is not the error", "", "Error: Unknown device type.\n-----", "Error: Unknown device type."},
		{"nothing printed", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Result{Stdout: tc.stdout, Stderr: tc.stderr}).ErrorLine(); got != tc.want {
				t.Errorf("ErrorLine() = %q, want %q", got, tc.want)
			}
		})
	}
}
