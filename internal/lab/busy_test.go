package lab

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestSocketHeld: a listening socket with no client is free; a client
// waiting in the backlog or accepted holds it; once it hangs up the socket
// is free again.
func TestSocketHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qga.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	check := func(when string, want bool) {
		t.Helper()
		if got, err := SocketHeld(path); got != want || err != nil {
			t.Errorf("SocketHeld(%s) = %v, %v; want %v", when, got, err, want)
		}
	}
	check("no client", false)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	check("a client in the backlog", true)
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	check("an accepted client", true)
	c.Close()
	s.Close()
	check("after the client left", false)
}

// TestSocketHeldTable reads a table taken from /proc/net/unix on a host
// where a lab VM's agent socket had one accepted client and one waiting.
func TestSocketHeldTable(t *testing.T) {
	table := `Num       RefCount Protocol Flags    Type St Inode Path
000000006718e94b: 00000002 00000000 00010000 0001 01 846806 /s/lab/vm1/qga.sock
00000000396b6a13: 00000003 00000000 00000000 0001 02     0 /s/lab/vm1/qga.sock
00000000dd485d71: 00000002 00000000 00010000 0001 01 846807 /s/lab/vm1/qmp.sock
0000000015b0e720: 00000003 00000000 00000000 0001 03 851066 /s/lab/vm2/qga.sock
00000000aaaaaaaa: 00000002 00000000 00000000 0001 03 851067
00000000bbbbbbbb: 00000002 00000000 00000000 0001 03 851068 /s/lab/vm3/my qga.sock
`
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/s/lab/vm1/qga.sock", true},  // one waiting (02)
		{"/s/lab/vm1/qmp.sock", false}, // only the listener
		{"/s/lab/vm2/qga.sock", true},  // one accepted (03)
		{"/s/lab/vm3/my qga.sock", true},
		{"/s/lab/vm4/qga.sock", false},
	} {
		if got, err := socketHeld(strings.NewReader(table), tc.path); got != tc.want || err != nil {
			t.Errorf("socketHeld(%s) = %v, %v; want %v", tc.path, got, err, tc.want)
		}
	}
}
