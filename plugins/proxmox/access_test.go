package proxmox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

func TestMissingPrivileges(t *testing.T) {
	all9 := map[string]flexBool{}
	for _, p := range Privileges(9) {
		all9[p.Name] = true
	}
	unprop := map[string]flexBool{}
	for k := range all9 {
		unprop[k] = false
	}
	for _, tc := range []struct {
		name  string
		major int
		perms map[string]map[string]flexBool
		want  string
	}{
		{"none", 9, nil, "VM.Audit VM.PowerMgmt VM.Snapshot VM.Snapshot.Rollback VM.Console VM.GuestAgent.Audit VM.GuestAgent.Unrestricted VM.GuestAgent.FileRead VM.GuestAgent.FileWrite"},
		{"all on /vms", 9, map[string]map[string]flexBool{"/vms": all9}, ""},
		{"not propagated on /vms", 9, map[string]map[string]flexBool{"/vms": all9, "/": {"VM.Audit": false}},
			""},
		{"not propagated on /", 9, map[string]map[string]flexBool{"/": unprop}, "VM.Audit VM.PowerMgmt VM.Snapshot VM.Snapshot.Rollback VM.Console VM.GuestAgent.Audit VM.GuestAgent.Unrestricted VM.GuestAgent.FileRead VM.GuestAgent.FileWrite"},
		{"unrestricted stands in", 9, map[string]map[string]flexBool{"/": {"VM.Audit": true, "VM.PowerMgmt": true, "VM.Snapshot": true, "VM.Console": true, "VM.GuestAgent.Unrestricted": true}}, ""},
		{"one vm", 9, map[string]map[string]flexBool{"/vms/101": {"VM.Audit": false, "VM.PowerMgmt": false, "VM.Snapshot": false, "VM.Console": false, "VM.GuestAgent.Unrestricted": false}}, ""},
		{"no console", 9, map[string]map[string]flexBool{"/vms": {"VM.Audit": true, "VM.PowerMgmt": true, "VM.Snapshot": true, "VM.GuestAgent.Unrestricted": true}}, "VM.Console"},
		{"pve 8 wants VM.Monitor", 8, map[string]map[string]flexBool{"/vms": all9}, "VM.Monitor"},
		{"pve 9 ignores VM.Monitor", 9, map[string]map[string]flexBool{"/vms": {"VM.Audit": true, "VM.PowerMgmt": true, "VM.Snapshot": true, "VM.Console": true, "VM.Monitor": true}},
			"VM.GuestAgent.Audit VM.GuestAgent.Unrestricted VM.GuestAgent.FileRead VM.GuestAgent.FileWrite"},
		{"storage path does not count", 9, map[string]map[string]flexBool{"/storage": all9}, "VM.Audit VM.PowerMgmt VM.Snapshot VM.Snapshot.Rollback VM.Console VM.GuestAgent.Audit VM.GuestAgent.Unrestricted VM.GuestAgent.FileRead VM.GuestAgent.FileWrite"},
	} {
		var names []string
		for _, p := range MissingPrivileges(tc.major, tc.perms) {
			names = append(names, p.Name)
		}
		if got := strings.Join(names, " "); got != tc.want {
			t.Errorf("MissingPrivileges(%d, %s) = %q; want %q", tc.major, tc.name, got, tc.want)
		}
	}
}

// TestAgentErrorWording: the three ways Proxmox words agent failures map
// to the same errors whatever the version.
func TestAgentErrorWording(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want error
	}{
		{"Agent error: Command guest-exec has been disabled", hypervisor.ErrCommandDisabled},
		{"Agent error: The command guest-exec has not been found", hypervisor.ErrCommandDisabled},
		{"Agent error: Invalid parameter 'pid'", hypervisor.ErrBackend}, // qga.Agent turns it into ErrUnknownExec
		{"VM 101 qmp command 'guest-exec' failed - got timeout", hypervisor.ErrTimeout},
		{"VM 101 qga command 'guest-exec' failed - got timeout", hypervisor.ErrTimeout},
		{"VM 101 qga command 'guest-exec' failed - Got EOF but command queue is not empty.", hypervisor.ErrAgentUnavailable},
		{"QEMU guest agent is not running", hypervisor.ErrAgentUnavailable},
		{"No QEMU guest agent configured", hypervisor.ErrAgentUnavailable},
		{"unable to connect to VM 101 qga socket - timeout after 31 retries", hypervisor.ErrAgentUnavailable},
		{"VM 101 is not running", hypervisor.ErrVMNotRunning},
		{"Permission check failed (/vms/101, VM.GuestAgent.Unrestricted)", hypervisor.ErrBackend},
		{"something else", hypervisor.ErrBackend},
	} {
		code := 500
		if strings.HasPrefix(tc.msg, "Permission") {
			code = 403
		}
		d := &Driver{tokenID: "u@pve!t"}
		err := d.classify("exec", agentErr("guest-exec-status", &APIError{StatusCode: code, Message: tc.msg}))
		if !errors.Is(err, tc.want) {
			t.Errorf("classify(agentErr(%q)) = %v; want %v", tc.msg, err, tc.want)
		}
	}
	d := &Driver{tokenID: "u@pve!t"}
	err := d.classify("exec", &APIError{StatusCode: 403, Message: "Permission check failed (/vms/101, VM.GuestAgent.FileRead|VM.GuestAgent.Unrestricted)"})
	if want := "grant VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted on /vms/101 to the API token u@pve!t"; !strings.Contains(err.Error(), want) {
		t.Errorf("classify(403) = %q; want it to say %q", err, want)
	}
}

// TestPrivilegesByVersion: a token with VM.Audit only opens (with a warning
// naming what is missing, per version) and each refused call names the
// privilege Proxmox wants; a token without VM.Audit does not open.
func TestPrivilegesByVersion(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	for _, tc := range []struct {
		v                 pveemu.Version
		exec, read, write string
	}{
		{pveemu.PVE84(), "VM.Monitor", "VM.Monitor", "VM.Monitor"},
		// exec's preflight (agent/info) is refused first.
		{pveemu.PVE90(), "VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileWrite or VM.GuestAgent.Unrestricted"},
		{pveemu.PVE92(), "VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted", "VM.GuestAgent.FileWrite or VM.GuestAgent.Unrestricted"},
	} {
		t.Run(tc.v.String(), func(t *testing.T) {
			e := startEmu(t, tc.v, []pveemu.ACL{{Path: "/vms", Privs: []string{"VM.Audit"}, Propagate: true}},
				pveemu.VMSpec{VMID: 101, Node: "pve", Name: "t1", Machine: pveemu.NewLabMachine(t1)})
			var logs bytes.Buffer
			cfg := e.cfg
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			ctx := ctxT(t)
			d, err := Open(ctx, cfg)
			if err != nil {
				t.Fatalf("Open() with VM.Audit only = %v; want a driver (and a warning)", err)
			}
			defer d.Close()
			for _, p := range driverPrivs(tc.v)[1:] {
				if !strings.Contains(logs.String(), p) {
					t.Errorf("Open() logged %q; want a warning naming %s", logs.String(), p)
				}
			}
			calls := []struct {
				name string
				err  error
				want string
			}{
				{"Power", d.Power(ctx, "101", hypervisor.PowerReset), "VM.PowerMgmt on /vms/101"},
				{"Run", func() error {
					_, err := hypervisor.Run(ctx, d, "101", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
					return err
				}(), tc.exec + " on /vms/101"},
				{"FileRead", func() error { _, err := d.FileRead(ctx, "101", "/etc/hostname", 10); return err }(), tc.read + " on /vms/101"},
				{"FileWrite", d.FileWrite(ctx, "101", "/tmp/x", []byte("x"), 0), tc.write + " on /vms/101"},
				// network-get-interfaces checks what exec's preflight does.
				{"GuestNetwork", func() error { _, err := d.GuestNetwork(ctx, "101"); return err }(), tc.exec + " on /vms/101"},
			}
			for _, c := range calls {
				if !errors.Is(c.err, hypervisor.ErrBackend) || !strings.Contains(fmt.Sprint(c.err), "grant "+c.want) {
					t.Errorf("%s without privileges = %v; want %v saying grant %s", c.name, c.err, hypervisor.ErrBackend, c.want)
				}
			}
			// status/current needs VM.Audit only.
			if m, err := d.VMMetrics(ctx, "101"); err != nil || m.MemoryBytes == nil {
				t.Errorf("VMMetrics(101) with VM.Audit only = %+v, %v; want the figures", m, err)
			}
		})
	}
	e := startEmu(t, pveemu.PVE92(), []pveemu.ACL{{Path: "/storage", Privs: []string{"Datastore.Audit"}, Propagate: true}})
	cfg := e.cfg
	cfg.Logger = quietLogger()
	if d, err := Open(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "VM.Audit") || !errors.Is(err, hypervisor.ErrBackend) {
		if d != nil {
			d.Close()
		}
		t.Errorf("Open() with a token that sees no VM = %v; want %v naming VM.Audit", err, hypervisor.ErrBackend)
	}
}

// TestFileReadCount: for max_bytes 1000 of a 17 MiB file the driver asks for
// 1001 bytes where Proxmox takes count (9.1.5+); before it reads the file
// whole (16 MiB), after one refused count on PVE 9.1.
func TestFileReadCount(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	const big = "/tmp/proxmox-count-17m"
	for _, tc := range []struct {
		v         pveemu.Version
		counts    []string // the count of each file-read request
		truncated bool
	}{
		{pveemu.PVE84(), []string{""}, true},
		{pveemu.PVE91(), []string{"1001", ""}, true},
		{pveemu.PVE92(), []string{"1001"}, true},
	} {
		t.Run(tc.v.String(), func(t *testing.T) {
			e := startEmu(t, tc.v, nil, pveemu.VMSpec{VMID: 101, Node: "pve", Name: "t1", Machine: pveemu.NewLabMachine(t1)})
			cfg := e.cfg
			cfg.Logger = quietLogger()
			// Reading 16 MiB in 1 MiB agent reads takes long on a loaded TCG
			// guest (the cost count avoids): a bound against hangs only.
			ctx, cancel := testload.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			d, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			res, err := hypervisor.Run(ctx, d, "101", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 17825792 /dev/zero | tr '\\0' x > " + big}})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("making the 17 MiB file: %+v, %v", res, err)
			}
			e.ResetTranscript()
			fc, err := d.FileRead(ctx, "101", big, 1000)
			if err != nil || len(fc.Data) != 1000 || !fc.Truncated || strings.Trim(string(fc.Data), "x") != "" {
				t.Fatalf("FileRead(17 MiB file, 1000) = %d bytes, truncated %v, %v; want 1000 x, truncated", len(fc.Data), fc.Truncated, err)
			}
			var counts []string
			for _, x := range e.Transcript() {
				if !strings.Contains(x.Request, "/agent/file-read?") {
					continue
				}
				c := ""
				if i := strings.Index(x.Request, "count="); i >= 0 {
					c = strings.SplitN(x.Request[i+len("count="):], "&", 2)[0]
				}
				counts = append(counts, c)
			}
			if fmt.Sprint(counts) != fmt.Sprint(tc.counts) {
				t.Errorf("file-read requests with count %q; want %q", counts, tc.counts)
			}
		})
	}
}

// TestLargeWriteWithoutExecLeavesNothing: a write over one request's limit
// is parts joined by agent/exec; a token that may write files but not exec
// is refused before any part is written, so the guest's directory is as it
// was (an independent check found the parts left behind).
func TestLargeWriteWithoutExecLeavesNothing(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), []pveemu.ACL{{Path: "/vms", Privs: []string{"VM.Audit", "VM.GuestAgent.Audit", "VM.GuestAgent.FileWrite"}, Propagate: true}},
		pveemu.VMSpec{VMID: 101, Node: "pve", Name: "t1", Machine: pveemu.NewLabMachine(labtest.VM(t, "t1"))})
	cfg := e.cfg
	cfg.Logger = quietLogger()
	ctx := ctxT(t)
	d, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// A second token of the same emulator, with every privilege, looks into
	// the guest (the guest agent serves one client: one emulator only).
	const fullID, fullSecret = "vmgate@pve!full", "0e6f1b7a-2c44-4e59-8d1b-6a7f3c2d9e50"
	if err := e.AddToken(pveemu.Token{ID: fullID, Secret: fullSecret, ACL: []pveemu.ACL{{Path: "/vms", Privs: driverPrivs(pveemu.PVE92()), Propagate: true}}}); err != nil {
		t.Fatal(err)
	}
	ca, secret := e.ClientFiles(t, fullSecret)
	fd, err := Open(ctx, Config{URL: e.URL(), TokenID: fullID, TokenSecretFile: secret, CAFile: ca, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	dir := fmt.Sprintf("/tmp/largewrite-%d", time.Now().UnixNano())
	ls := func() string {
		res, err := hypervisor.Run(ctx, fd, "101", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `mkdir -p "$1" && ls -A "$1"`, "sh", dir}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("ls %s = %+v, %v", dir, res, err)
		}
		return string(res.Stdout)
	}
	if got := ls(); got != "" {
		t.Fatalf("ls %s before = %q; want empty", dir, got)
	}
	err = d.FileWrite(ctx, "101", dir+"/big", bytes.Repeat([]byte("x"), 3*writeChunk+1), 0)
	if !errors.Is(err, hypervisor.ErrBackend) || !strings.Contains(err.Error(), "VM.GuestAgent.Unrestricted") {
		t.Errorf("FileWrite(%d bytes) with FileWrite but no exec = %v; want %v naming VM.GuestAgent.Unrestricted", 3*writeChunk+1, err, hypervisor.ErrBackend)
	}
	if got := ls(); got != "" {
		t.Errorf("ls %s after the refused write = %q; want empty (no part left)", dir, got)
	}
}
