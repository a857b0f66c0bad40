package machines

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/nox-mesh/nox-mesh-host/shapes"
	"github.com/nox-mesh/nox-mesh-host/tests/lab"
)

// The store after kill -9 mid-apply of a declaration mixing the shapes that
// touch a machine's own databases and init: whatever instant the executor
// dies at, the next apply converges, the one after changes nothing, and
// undeclaring gives everything back — the unit stopped again, the files
// the host made removed, the user forgotten but kept.
func TestKillNineMidApplyOfMixedShapes(t *testing.T) {
	m := boot(t, lab.Options{Seed: map[string]string{
		"/etc/systemd/system/lp-mix.service": fmt.Sprintf(unit, "mixed"),
		"/root/fw.nft":                       foundRuleset,
	}})
	// A found firewall for the opening to be made through.
	m.sh("nft -f /root/fw.nft")
	operator := m.sh("nft list ruleset")
	// An archive for the declaration, in the lab as root's file.
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf("entry %d\n", i)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("t/e%02d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	sum := sha256.Sum256(buf.Bytes())
	m.WriteFile("/root/theme.tgz", buf.Bytes(), 0o600)

	res := []string{
		`{"module":"mix","id":"dir","type":"directory","path":"/srv/mix"}`,
		`{"module":"mix","id":"user","type":"user","name":"lpmix","shell":"/bin/sh","home":"/home/lpmix","groups":["audio"]}`,
	}
	for i := 0; i < 200; i++ {
		res = append(res, fmt.Sprintf(`{"module":"mix","id":"f%03d","type":"file","path":"/srv/mix/f%03d","content":"%s"}`, i, i, strings.Repeat("x", 200)))
	}
	res = append(res,
		`{"module":"mix","id":"theme","type":"archive","url":"file:///root/theme.tgz","sha256":"`+hex.EncodeToString(sum[:])+`","destination":"/srv/mix"}`,
		`{"module":"mix","id":"svc","type":"service","unit":"lp-mix","state":"running","enabled":true,"restart_on":["f000"]}`,
		`{"module":"mix","id":"wg","type":"overlay","interface":"wgmix","address":"10.233.8.1/24","listen_port":51821,"peers":[]}`,
		`{"module":"mix","id":"http","type":"opening","port":8081,"protocol":"tcp","path":"incoming"}`)
	full := decl(res...)

	// How long a whole apply takes here, to spread the kills over it.
	start := time.Now()
	rep, code := m.apply(full)
	if code != 0 {
		t.Fatalf("exit %d %+v", code, rep)
	}
	whole := time.Since(start)
	m.apply(decl())
	m.sh("userdel lpmix 2>/dev/null; rm -rf /home/lpmix; systemctl disable --now lp-mix 2>/dev/null || true")
	m.WriteFile("/root/full.json", []byte(full), 0o600)

	rng := rand.New(rand.NewSource(7))
	for i := 0; i < 10; i++ {
		delay := time.Duration(rng.Int63n(int64(whole)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		// Killed from outside the executor's own process, at a random instant.
		m.Run(ctx, "/bin/sh", "-c", fmt.Sprintf("/usr/local/bin/mesh-executor apply /root/full.json >/dev/null 2>&1 & p=$!; sleep %.4f; kill -9 $p; wait $p 2>/dev/null; true", delay.Seconds()))
		cancel()
		rep, code := m.apply(full)
		if code != 0 {
			t.Fatalf("kill %d at %v: the next apply: exit %d %+v", i, delay, code, rep)
		}
		by := map[shapes.Outcome]int{}
		for _, l := range rep.Lines {
			by[l.Outcome]++
		}
		t.Logf("kill %d at %v of %v: the next apply: %v", i, delay.Round(time.Millisecond), whole.Round(time.Millisecond), by)
		rep, _ = m.apply(full)
		for _, l := range rep.Lines {
			if l.Outcome != shapes.Unchanged {
				t.Fatalf("kill %d at %v: the apply after the repair still changed %s.%s: %s %s", i, delay, l.Module, l.ID, l.Outcome, l.Detail)
			}
		}
		if m.sh("systemctl is-active lp-mix") != "active" || m.sh("getent passwd lpmix >/dev/null && echo yes") != "yes" {
			t.Fatalf("kill %d: the machine does not hold the declaration", i)
		}
		// Asserted from outside the executor: the tunnel's interface with
		// its address, and the opening's rule in the found input chain.
		if !strings.Contains(m.sh("ip -br addr show wgmix 2>&1 || true"), "10.233.8.1/24") ||
			!strings.Contains(m.sh("nft list chain inet filter input"), `tcp dport 8081 accept comment "nox-mesh-host mix.http"`) {
			t.Fatalf("kill %d: the overlay or the opening is not as declared:\n%s\n%s", i, m.sh("ip -br addr"), m.sh("nft list ruleset"))
		}
		// owned agrees with the machine: every declared thing listed, none pending.
		out := m.sh("/usr/local/bin/mesh-executor owned --json")
		var owned []struct {
			Target  string `json:"target"`
			Pending bool   `json:"pending"`
		}
		json.Unmarshal([]byte(out), &owned)
		if len(owned) != len(res) {
			t.Fatalf("kill %d: owned lists %d entries for %d resources", i, len(owned), len(res))
		}
		for _, o := range owned {
			if o.Pending {
				t.Fatalf("kill %d: %s is still pending after a whole apply", i, o.Target)
			}
		}
		// Undeclare everything, so each kill lands on a first apply from a
		// clean machine, where there is the most to interrupt.
		m.apply(decl())
		m.sh("userdel lpmix; rm -rf /home/lpmix; systemctl disable --now lp-mix 2>/dev/null || true")
	}
	m.apply(full)
	rep, _ = m.apply(decl())
	if m.sh("systemctl is-active lp-mix || true") != "inactive" || m.sh("systemctl is-enabled lp-mix || true") != "disabled" {
		t.Fatalf("the unit was not given back stopped and disabled: %+v", rep.Lines)
	}
	if m.sh("ls /srv 2>/dev/null | wc -l") != "0" {
		t.Fatalf("what the host made is still there: %s", m.sh("find /srv"))
	}
	if m.sh("getent passwd lpmix >/dev/null && echo yes") != "yes" {
		t.Fatal("the user was deleted; it is only ever forgotten")
	}
	if m.sh("ip link show wgmix >/dev/null 2>&1 && echo yes || echo no") != "no" || m.sh("nft list ruleset") != operator {
		t.Fatalf("the overlay or the opening outlived the undeclare, or the operator's rules changed:\n%s", m.sh("nft list ruleset"))
	}
}
