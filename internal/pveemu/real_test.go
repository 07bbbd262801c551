package pveemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realDir holds real Proxmox VE answers from public material (see its README).
const realDir = "../../testdata/proxmox"

func readReal(t *testing.T, name string) (string, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(realDir, name))
	if err != nil {
		t.Fatal(err)
	}
	line, body, _ := bytes.Cut(raw, []byte("\n"))
	return string(line), body
}

// TestRealAnswers: the emulator answers what real servers answered in the
// same situation, byte for byte where the version matches.
func TestRealAnswers(t *testing.T) {
	// A VM whose agent is enabled but not running, on PVE 9.0.
	_, c := emu(t, PVE90, allVMPrivs(PVE90), VMSpec{VMID: 198, Node: "pve", Running: true})
	line, body := readReal(t, "agent-not-running.response")
	r := c.do("GET", "/nodes/pve/qemu/198/agent/network-get-interfaces", nil)
	if got := fmt.Sprintf("%d %s", r.code, r.reason); got != line || r.raw != string(body) {
		t.Errorf("agent/network-get-interfaces = %s %s; want the real %s %s", got, r.raw, line, body)
	}
	// exec-status without pid (the real answer is from PVE 7, before the
	// body's message): same status line and errors.
	line, body = readReal(t, "exec-status-no-pid.response")
	r = c.do("GET", "/nodes/pve/qemu/198/agent/exec-status", nil)
	var real struct{ Errors map[string]string }
	json.Unmarshal(body, &real)
	if got := fmt.Sprintf("%d %s", r.code, r.reason); got != line || fmt.Sprint(r.body.Errors) != fmt.Sprint(real.Errors) {
		t.Errorf("agent/exec-status without pid = %s %v; want the real %s %v", got, r.body.Errors, line, real.Errors)
	}
}

// TestRealUPIDs: the emulator's UPID pattern takes what pve-common's own
// tests decode and refuses the rest.
func TestRealUPIDs(t *testing.T) {
	for file, valid := range map[string]bool{"upids.valid": true, "upids.invalid": false} {
		raw, err := os.ReadFile(filepath.Join(realDir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, upid := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			if got := upidRE.MatchString(upid); got != valid {
				t.Errorf("upidRE.MatchString(%q) = %v; want %v", upid, got, valid)
			}
		}
	}
}
