package pveemu

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// labEmu is an emulator of version v with the shared lab VMs behind vmids
// 101 (t1) and 103 (noexec, guest-exec blocked).
func labEmu(t *testing.T, v Version) client {
	t.Helper()
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	_, c := emu(t, v, allVMPrivs(v),
		VMSpec{VMID: 101, Node: "pve", Name: "t1", Machine: NewLabMachine(t1)},
		VMSpec{VMID: 103, Node: "pve-2", Name: "noexec", Machine: NewLabMachine(noexec)})
	return c
}

// execWait runs argv through agent/exec and polls exec-status until exited.
func (c client) execWait(node string, vmid int, argv []string, stdin string) map[string]any {
	c.t.Helper()
	body := map[string]any{"command": argv}
	if stdin != "" {
		body["input-data"] = stdin
	}
	// Proxmox gives the agent 5 s (qgaTimeout); a TCG guest on a loaded
	// machine (after a rollback above all) can take longer to answer, and a
	// client then asks again: the commands here may run twice.
	deadline := time.Now().Add(testload.Scale(2 * time.Minute))
	r := c.jsonBody("POST", fmt.Sprintf("/nodes/%s/qemu/%d/agent/exec", node, vmid), body)
	for r.code == 500 && strings.Contains(r.raw, "got timeout") && time.Now().Before(deadline) {
		r = c.jsonBody("POST", fmt.Sprintf("/nodes/%s/qemu/%d/agent/exec", node, vmid), body)
	}
	var started struct{ PID int }
	r.data(c.t, &started)
	if r.code != 200 || started.PID <= 0 {
		c.t.Fatalf("agent/exec %q = %d %s", argv, r.code, r.raw)
	}
	for {
		r := c.do("GET", fmt.Sprintf("/nodes/%s/qemu/%d/agent/exec-status", node, vmid), url.Values{"pid": {fmt.Sprint(started.PID)}})
		if r.code != 200 {
			c.t.Fatalf("agent/exec-status = %d %s", r.code, r.raw)
		}
		var st map[string]any
		r.data(c.t, &st)
		if fmt.Sprint(st["exited"]) == "1" {
			return st
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// TestAgentLab: exec through the real qemu-ga, with exec-status's 1/0
// booleans and byte strings, and the wording of an agent error per version.
func TestAgentLab(t *testing.T) {
	for _, v := range []Version{PVE84(), PVE92()} {
		t.Run(v.String(), func(t *testing.T) {
			c := labEmu(t, v)
			st := c.execWait("pve", 101, []string{"/bin/sh", "-c", "printf 'a\\377b'; head -c 20000 /dev/zero >&2; exit 3"}, "")
			if st["exitcode"] != float64(3) || st["out-data"] != "a\u00ffb" || st["exited"] != float64(1) {
				t.Errorf("exec-status = %v; want exitcode 3, exited 1, out-data %q", st, "a\u00ffb")
			}
			if s, _ := st["err-data"].(string); len(s) == 0 {
				t.Errorf("exec-status err-data empty; want the zeros")
			}
			cat := c.execWait("pve", 101, []string{"cat"}, "in\u00e9")
			if cat["out-data"] != "in\u00e9" {
				t.Errorf("cat with input-data = %v; want the bytes back", cat)
			}
			// qemu-ga answers an error for the blocked guest-exec: Agent
			// error (check_agent_error), in every version.
			r := c.jsonBody("POST", "/nodes/pve-2/qemu/103/agent/exec", map[string]any{"command": []string{"/bin/true"}})
			if r.code != 500 || !strings.HasPrefix(r.reason, "Agent error: ") || !strings.Contains(r.reason, "disabled") {
				t.Errorf("agent/exec on noexec = %d %q; want 500 Agent error: ... disabled", r.code, r.reason)
			}
			// info relays the error-free reply in {result}.
			var info struct {
				Result struct {
					Version  string
					Commands []struct {
						Name    string
						Enabled bool
					} `json:"supported_commands"`
				}
			}
			c.do("GET", "/nodes/pve-2/qemu/103/agent/info", nil).data(t, &info)
			execOn := true
			for _, cmd := range info.Result.Commands {
				if cmd.Name == "guest-exec" {
					execOn = cmd.Enabled
				}
			}
			if info.Result.Version == "" || execOn {
				t.Errorf("agent/info on noexec = %+v; want a version and guest-exec disabled", info.Result)
			}
			// An unknown pid: qemu-ga's error, through check_agent_error.
			r = c.do("GET", "/nodes/pve/qemu/101/agent/exec-status", url.Values{"pid": {"999999"}})
			if r.code != 500 || !strings.HasPrefix(r.reason, "Agent error: ") {
				t.Errorf("exec-status of an unknown pid = %d %q; want 500 Agent error", r.code, r.reason)
			}
		})
	}
}

// TestFileLab: file-write (encode 0: base64) and file-read with count and
// truncated (9.1.5+) or the whole file (before).
func TestFileLab(t *testing.T) {
	for _, v := range []Version{PVE84(), PVE92()} {
		t.Run(v.String(), func(t *testing.T) {
			c := labEmu(t, v)
			data := make([]byte, 3<<20) // three 1 MiB reads
			for i := range data {
				data[i] = byte(i * 7)
			}
			path := "/tmp/pveemu-" + v.String()
			// 60 KiB per request: write the first piece, append the rest by exec.
			r := c.jsonBody("POST", "/nodes/pve/qemu/101/agent/file-write",
				map[string]any{"file": path, "content": base64.StdEncoding.EncodeToString(data[:40000]), "encode": 0})
			if r.code != 200 || string(r.body.Data) != "null" {
				t.Fatalf("file-write = %d %s", r.code, r.raw)
			}
			c.execWait("pve", 101, []string{"/bin/sh", "-c", fmt.Sprintf("head -c %d /dev/zero >> %s", len(data)-40000, path)}, "")
			full := append(append([]byte{}, data[:40000]...), make([]byte, len(data)-40000)...)
			read := func(q url.Values) (string, map[string]any) {
				q.Set("file", path)
				r := c.do("GET", "/nodes/pve/qemu/101/agent/file-read", q)
				if r.code != 200 {
					t.Fatalf("file-read %v = %d %s", q, r.code, r.raw)
				}
				var d map[string]any
				r.data(t, &d)
				s, _ := d["content"].(string)
				return s, d
			}
			content, d := read(url.Values{})
			if content != latin1(full) || d["bytes-read"] != float64(len(full)) || d["truncated"] != nil {
				t.Errorf("file-read = %d characters, %v; want the %d bytes, not truncated", len(content), d["bytes-read"], len(full))
			}
			if v.FileReadCount() {
				content, d = read(url.Values{"count": {"1000"}, "offset": {"5"}})
				if content != latin1(full[5:1005]) || d["truncated"] != float64(1) {
					t.Errorf("file-read count 1000 offset 5 = %d characters, truncated %v; want 1000, truncated 1", len(content), d["truncated"])
				}
			}
			r = c.do("GET", "/nodes/pve/qemu/101/agent/file-read", url.Values{"file": {path + ".missing"}})
			if r.code != 500 || !strings.HasPrefix(r.reason, "Agent error: ") {
				t.Errorf("file-read of a missing file = %d %q; want 500 Agent error", r.code, r.reason)
			}
		})
	}
}

// TestPowerLab: stop and start really end and launch the QEMU behind the
// VM; reset reboots the guest.
func TestPowerLab(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "pvepower"})
	m := NewLabMachine(v)
	t.Cleanup(func() { m.Close() })
	e, c := emu(t, PVE92(), allVMPrivs(PVE92()), VMSpec{VMID: 110, Node: "pve", Name: "power", Machine: m})
	run := func(action, want string) {
		t.Helper()
		r := c.do("POST", "/nodes/pve/qemu/110/status/"+action, url.Values{})
		var upid string
		r.data(t, &upid)
		if st := c.waitTask("pve", upid); st["exitstatus"] != want {
			t.Fatalf("status/%s task = %v; want exitstatus %q", action, st, want)
		}
	}
	run("start", "VM 110 already running")
	run("stop", "OK")
	if e.Running(110) {
		t.Fatalf("QEMU still running after the stop task")
	}
	var cur map[string]any
	c.do("GET", "/nodes/pve/qemu/110/status/current", nil).data(t, &cur)
	if cur["status"] != "stopped" || cur["qmpstatus"] != nil {
		t.Errorf("status/current after stop = %v; want stopped without qmpstatus", cur)
	}
	run("start", "OK")
	c.do("GET", "/nodes/pve/qemu/110/status/current", nil).data(t, &cur)
	if cur["status"] != "running" || cur["qmpstatus"] != "running" || cur["agent"] != float64(1) {
		t.Errorf("status/current after start = %v; want running, qmpstatus running, agent 1", cur)
	}
	run("reset", "OK")
	run("stop", "OK")
}

// TestSnapshotLab: a snapshot with vmstate saves the guest (its files live in
// RAM); a rollback brings the file back as it was; delete removes it.
func TestSnapshotLab(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "pvesnap"})
	m := NewLabMachine(v)
	t.Cleanup(func() { m.Close() })
	_, c := emu(t, PVE92(), allVMPrivs(PVE92()), VMSpec{VMID: 120, Node: "pve", Name: "snap", Machine: m})
	task := func(r reply) map[string]any { t.Helper(); return c.taskOf("pve", r) }
	write := func(s string) {
		c.execWait("pve", 120, []string{"/bin/sh", "-c", "echo " + s + " > /tmp/snapfile"}, "")
	}
	read := func() string {
		st := c.execWait("pve", 120, []string{"cat", "/tmp/snapfile"}, "")
		s, _ := st["out-data"].(string)
		return s
	}
	write("before")
	st := task(c.do("POST", "/nodes/pve/qemu/120/snapshot", url.Values{"snapname": {"s1"}, "vmstate": {"1"}, "description": {"first"}}))
	if st["exitstatus"] != "OK" {
		t.Fatalf("snapshot task = %v", st)
	}
	if st := task(c.do("POST", "/nodes/pve/qemu/120/snapshot", url.Values{"snapname": {"s1"}})); st["exitstatus"] != "snapshot name 's1' already used" {
		t.Errorf("second snapshot s1 = %v; want %q", st["exitstatus"], "snapshot name 's1' already used")
	}
	write("after")
	if st := task(c.do("POST", "/nodes/pve/qemu/120/snapshot/s1/rollback", url.Values{})); st["exitstatus"] != "OK" {
		t.Fatalf("rollback task = %v", st)
	}
	c.waitAgent("pve", 120)
	if got := read(); got != "before\n" {
		t.Errorf("file after rollback = %q; want %q", got, "before\n")
	}
	var list []map[string]any
	c.do("GET", "/nodes/pve/qemu/120/snapshot", nil).data(t, &list)
	if len(list) != 2 || list[0]["name"] != "s1" || list[0]["vmstate"] != float64(1) || list[0]["description"] != "first" ||
		list[1]["name"] != "current" || list[1]["parent"] != "s1" || list[1]["running"] != float64(1) {
		t.Errorf("snapshot list = %v; want s1 (vmstate 1) and current (parent s1, running)", list)
	}
	if st := task(c.do("DELETE", "/nodes/pve/qemu/120/snapshot/s1", nil)); st["exitstatus"] != "OK" {
		t.Fatalf("delete task = %v", st)
	}
	if st := task(c.do("POST", "/nodes/pve/qemu/120/snapshot/s1/rollback", url.Values{})); st["exitstatus"] != "snapshot 's1' does not exist" {
		t.Errorf("rollback to a deleted snapshot = %v; want %q", st["exitstatus"], "snapshot 's1' does not exist")
	}
	if r := c.do("POST", "/nodes/pve/qemu/120/snapshot", url.Values{"snapname": {"current"}}); r.code != 500 || r.reason != "unable to use snapshot name 'current' (reserved name)" {
		t.Errorf("snapshot named current = %d %q; want the reserved-name error", r.code, r.reason)
	}
}

// waitAgent polls agent/ping until the agent answers (after a rollback or a
// start the guest agent needs a moment).
func (c client) waitAgent(node string, vmid int) {
	c.t.Helper()
	deadline := time.Now().Add(testload.Scale(2 * time.Minute))
	for {
		r := c.do("POST", fmt.Sprintf("/nodes/%s/qemu/%d/agent/ping", node, vmid), url.Values{})
		if r.code == 200 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("agent of %d does not answer: %d %s", vmid, r.code, r.reason)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

// TestStatusNetworkLab: status/current reports the lab VM's own figures
// (vmstatus: the QEMU process's memory, query-blockstats' bytes, which grow
// when the guest writes and syncs; memhost from 9.0.11 on; cpu after a
// burn longer than vmstatus's 1000 ticks of all host CPUs) and
// agent/network-get-interfaces relays the guest's interfaces in {result}.
func TestStatusNetworkLab(t *testing.T) {
	for _, v := range []Version{PVE84(), PVE92()} {
		t.Run(v.String(), func(t *testing.T) {
			c := labEmu(t, v)
			type status struct {
				Status, QMPStatus   string
				CPUs                int
				CPU                 float64
				Mem, MaxMem         int64
				MemHost             *int64
				DiskRead, DiskWrite *int64
				NetIn, NetOut       *int64
			}
			read := func() status {
				var st status
				c.do("GET", "/nodes/pve/qemu/101/status/current", nil).data(t, &st)
				return st
			}
			s1 := read()
			if s1.Status != "running" || s1.QMPStatus != "running" || s1.CPUs < 1 || s1.Mem <= 0 || s1.Mem > s1.MaxMem ||
				s1.DiskRead == nil || *s1.DiskRead <= 0 || s1.DiskWrite == nil || s1.NetIn == nil || s1.NetOut == nil {
				t.Fatalf("status/current = %+v; want running with the QEMU process's memory, disk and network figures", s1)
			}
			if (s1.MemHost != nil) != v.MemHost() || (s1.MemHost != nil && *s1.MemHost != s1.Mem) {
				t.Errorf("status/current memhost = %v (mem %d); want it set (as mem) = %v", s1.MemHost, s1.Mem, v.MemHost())
			}
			burn := `end=$(($(date +%s) + 7)); i=0; while [ "$(date +%s)" -lt "$end" ]; do i=$((i + 1)); done; ` +
				`head -c 1048576 /dev/urandom > /data/pveemu-status.bin && sync && rm -f /data/pveemu-status.bin && sync`
			if st := c.execWait("pve", 101, []string{"/bin/sh", "-c", burn}, ""); st["exitcode"] != float64(0) {
				t.Fatalf("burn and write in the guest = %v; want exit 0", st)
			}
			s2 := read()
			if *s2.DiskWrite-*s1.DiskWrite < 1<<20 {
				t.Errorf("status/current diskwrite %d then %d after 1 MiB written and synced; want at least 1 MiB more", *s1.DiskWrite, *s2.DiskWrite)
			}
			if s2.CPU <= 0 {
				t.Errorf("status/current cpu = %v after 7 s of a busy guest CPU; want it above 0", s2.CPU)
			}
			var net struct {
				Result []struct {
					Name string `json:"name"`
					IPs  []struct {
						Type string `json:"ip-address-type"`
						IP   string `json:"ip-address"`
					} `json:"ip-addresses"`
				} `json:"result"`
			}
			c.do("GET", "/nodes/pve/qemu/101/agent/network-get-interfaces", nil).data(t, &net)
			lo := false
			for _, ifc := range net.Result {
				for _, a := range ifc.IPs {
					lo = lo || (ifc.Name == "lo" && a.Type == "ipv4" && a.IP == "127.0.0.1")
				}
			}
			if !lo {
				t.Errorf("agent/network-get-interfaces = %+v; want the guest's lo with 127.0.0.1", net.Result)
			}
		})
	}
}
