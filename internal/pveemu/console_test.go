package pveemu

import (
	"net/url"
	"strings"
	"testing"
)

// TestConsoleRefusals: the console methods check VM.Console, the ticket
// (its user, path, port and signature), the port's range and a running
// VM, as qemu-server does, before anything is opened.
func TestConsoleRefusals(t *testing.T) {
	_, c := emu(t, PVE92(), []string{"VM.Audit", "VM.Console"},
		VMSpec{VMID: 101, Node: "pve", Name: "a", Running: true}, VMSpec{VMID: 102, Node: "pve", Name: "off"})
	_, audit := emu(t, PVE92(), []string{"VM.Audit"}, VMSpec{VMID: 101, Node: "pve", Name: "a", Running: true})
	forged := "PVEVNC:6770F00D::" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		c            client
		method, path string
		params       url.Values
		code         int
		reason       string
	}{
		{audit, "PUT", "/nodes/pve/qemu/101/sendkey", url.Values{"key": {"ctrl-alt-delete"}}, 403, "Permission check failed (/vms/101, VM.Console)"},
		{audit, "POST", "/nodes/pve/qemu/101/vncproxy", url.Values{"websocket": {"1"}}, 403, "Permission check failed (/vms/101, VM.Console)"},
		{audit, "POST", "/nodes/pve/qemu/101/termproxy", nil, 403, "Permission check failed (/vms/101, VM.Console)"},
		{c, "PUT", "/nodes/pve/qemu/102/sendkey", url.Values{"key": {"a"}}, 500, "VM 102 not running"},
		{c, "PUT", "/nodes/pve/qemu/101/sendkey", nil, 400, "Parameter verification failed."},
		{c, "PUT", "/nodes/pve/qemu/101/sendkey", url.Values{"key": {"a"}, "skiplock": {"1"}}, 400, "Parameter verification failed."},
		{c, "GET", "/nodes/pve/qemu/101/vncwebsocket", url.Values{"port": {"5900"}, "vncticket": {forged}}, 401, "permission denied - invalid PVEVNC ticket"},
		{c, "GET", "/nodes/pve/qemu/101/vncwebsocket", url.Values{"port": {"6000"}, "vncticket": {forged}}, 400, "Parameter verification failed."},
		{c, "GET", "/nodes/pve/qemu/101/vncwebsocket", url.Values{"port": {"5900"}, "vncticket": {strings.Repeat("x", 513)}}, 400, "Parameter verification failed."},
		{c, "POST", "/nodes/pve/qemu/101/termproxy", url.Values{"serial": {"serial9"}}, 400, "Parameter verification failed."},
		{c, "POST", "/nodes/pve/qemu/999/vncproxy", nil, 500, "Configuration file 'nodes/pve/qemu-server/999.conf' does not exist"},
	} {
		r := tc.c.do(tc.method, tc.path, tc.params)
		if r.code != tc.code || r.reason != tc.reason {
			t.Errorf("%s %s %v = %d %q; want %d %q", tc.method, tc.path, tc.params, r.code, r.reason, tc.code, tc.reason)
		}
	}
}

// TestVNCTicket: a ticket verifies for its own user, path and port only,
// with or without vncproxy's password prefix.
func TestVNCTicket(t *testing.T) {
	e, _ := emu(t, PVE92(), []string{"VM.Audit"})
	tk := e.vncTicket("u@pve!t", "/vms/101", 5901)
	for _, tc := range []struct {
		ticket, user, path string
		port               int
		ok                 bool
	}{
		{tk, "u@pve!t", "/vms/101", 5901, true},
		{"pw!x:'~:" + tk, "u@pve!t", "/vms/101", 5901, true},
		{tk, "other@pve", "/vms/101", 5901, false},
		{tk, "u@pve!t", "/vms/102", 5901, false},
		{tk, "u@pve!t", "/vms/101", 5902, false},
		{strings.Replace(tk, "::", "::0", 1), "u@pve!t", "/vms/101", 5901, false},
		{"", "u@pve!t", "/vms/101", 5901, false},
	} {
		if err := e.verifyVNCTicket(tc.ticket, tc.user, tc.path, tc.port); (err == nil) != tc.ok {
			t.Errorf("verifyVNCTicket(%q, %s, %s, %d) = %v; want ok %v", tc.ticket, tc.user, tc.path, tc.port, err, tc.ok)
		}
	}
}
