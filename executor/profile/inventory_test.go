package profile

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestCollectThisMachine(t *testing.T) {
	inv, err := Collect(t.Context(), "1.2.3")
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	t.Logf("%+v", inv)
	if inv.Hostname == "" || inv.Kernel == "" || inv.MemoryBytes == 0 || inv.CPUs < 1 {
		t.Errorf("incomplete inventory: %+v", inv)
	}
	if inv.HostVersion != "1.2.3" || inv.Holds != 0 {
		t.Errorf("host version / holds: %+v", inv)
	}
	if !strings.HasPrefix(inv.Arch, runtime.GOARCH) {
		t.Errorf("arch %q does not start with %q", inv.Arch, runtime.GOARCH)
	}
	if inv.MachineID != "" && !isMachineID(inv.MachineID) {
		t.Errorf("machine id %q", inv.MachineID)
	}

	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"hostname", "machine_id", "arch", "kernel", "os_release", "memory_bytes", "cpus", "host_version", "holds"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("inventory JSON %s lacks %q", b, k)
		}
	}
	if len(keys) != 9 {
		t.Errorf("inventory JSON has %d keys, want 9: %s", len(keys), b)
	}
}

func TestCollectCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Collect(ctx, "x"); err == nil || !strings.HasPrefix(err.Error(), "profile: ") {
		t.Fatalf("cancelled Collect: %v", err)
	}
}
