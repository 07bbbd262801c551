//go:build linux

package agent

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shirou/gopsutil/v4/process"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// gopsutilRow is what gopsutil v4 says about pid: the reference the
// direct /proc reader is checked (and benchmarked) against.
type gopsutilRow struct {
	PPID      int32
	Name      string
	Cmdline   string
	User      string // "" when gopsutil cannot name the uid
	StartedAt int64  // ms since the epoch
}

func gopsutilProcess(ctx context.Context, pid int32) (gopsutilRow, error) {
	p := &process.Process{Pid: pid}
	var r gopsutilRow
	var err error
	if r.PPID, err = p.PpidWithContext(ctx); err != nil {
		return r, err
	}
	if r.Name, err = p.NameWithContext(ctx); err != nil {
		return r, err
	}
	args, err := p.CmdlineSliceWithContext(ctx)
	if err != nil {
		return r, err
	}
	r.Cmdline = strings.Join(args, " ")
	r.User, _ = p.UsernameWithContext(ctx)
	if r.StartedAt, err = p.CreateTimeWithContext(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// TestPSMatchesGopsutil compares the direct reader with gopsutil for this
// host's own processes, including one with spaces in its arguments and a
// 15-character comm.
func TestPSMatchesGopsutil(t *testing.T) {
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep on PATH: %v", err)
	}
	long := filepath.Join(dir, "a-rather-long-process-name")
	if err := os.Symlink(sleep, long); err != nil {
		t.Fatal(err)
	}
	var ours []int32
	for _, argv := range [][]string{{sleep, "1061"}, {long, "1062"}, {sleep, "1063", "  "}} {
		c := exec.Command(argv[0], argv[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		ours = append(ours, int32(c.Process.Pid))
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	a := hostAgent(t)
	ctx := context.Background()
	// Other processes of the host can change under the scan (a kernel
	// worker renames itself with the work it picks up, a shell execs): read
	// them with gopsutil before and after, and compare only those that did
	// not change in between. The test's own processes are always compared.
	before := map[int32]gopsutilRow{}
	if pids, err := process.PidsWithContext(ctx); err == nil {
		for _, pid := range pids {
			if ref, err := gopsutilProcess(ctx, pid); err == nil {
				before[pid] = ref
			}
		}
	}
	rows, err := a.PS(ctx, "")
	if err != nil {
		t.Fatalf("PS() = %v; want nil", err)
	}
	compared := map[int32]bool{}
	for _, row := range rows {
		ref, err := gopsutilProcess(ctx, row.PID)
		if err != nil {
			continue // gone since the scan
		}
		if !slices.Contains(ours, row.PID) && before[row.PID] != ref {
			continue // changed during the scan
		}
		compared[row.PID] = true
		if row.PPID != ref.PPID {
			t.Errorf("PS()[%d].PPID = %d; gopsutil %d", row.PID, row.PPID, ref.PPID)
		}
		// gopsutil completes a 15-byte (truncated) comm from the cmdline.
		if workerName(row.Name) != workerName(ref.Name) && !(len(row.Name) == 15 && strings.HasPrefix(ref.Name, row.Name)) {
			t.Errorf("PS()[%d].Name = %q; gopsutil %q", row.PID, row.Name, ref.Name)
		}
		if row.Cmdline != ref.Cmdline {
			t.Errorf("PS()[%d].Cmdline = %q; gopsutil %q", row.PID, row.Cmdline, ref.Cmdline)
		}
		if ref.User != "" && row.User != ref.User {
			t.Errorf("PS()[%d].User = %q; gopsutil %q", row.PID, row.User, ref.User)
		}
		if d := row.StartedAt - ref.StartedAt; d < -10 || d > 10 {
			t.Errorf("PS()[%d].StartedAt = %d; gopsutil %d (%+d ms)", row.PID, row.StartedAt, ref.StartedAt, d)
		}
	}
	for _, pid := range ours {
		if !compared[pid] {
			t.Errorf("PS() has no row for the test's own process %d (rows for %v)", pid, slices.Sorted(maps.Keys(compared)))
		}
	}
	if len(compared) < 4 {
		t.Errorf("compared %d processes with gopsutil; want at least 4", len(compared))
	}
}

// TestPSSessionFilterHost runs processes in a marker session on the host and
// checks that PS(session) returns exactly them, and PS() tags them.
func TestPSSessionFilterHost(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	id := "feedfacefeedface0a05"
	if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: id}); err != nil {
		t.Fatalf("SessionCreate = %v", err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(ctx, id) })
	if _, err := a.Run(ctx, wire.RunRequest{Session: id, TimeoutMS: 10000, Shell: `sleep 1071 & sleep 1072 &`}); err != nil {
		t.Fatalf("Run = %v", err)
	}
	only, err := a.PS(ctx, id)
	if err != nil {
		t.Fatalf("PS(%s) = %v", id, err)
	}
	var got []string
	for _, p := range only {
		if p.Session != id {
			t.Errorf("PS(%s) row %+v has session %q", id, p, p.Session)
		}
		got = append(got, p.Cmdline)
	}
	if len(only) != 2 || !strings.Contains(strings.Join(got, ","), "sleep 1071") || !strings.Contains(strings.Join(got, ","), "sleep 1072") {
		t.Errorf("PS(%s) cmdlines = %q; want the two sleeps", id, got)
	}
	all, err := a.PS(ctx, "")
	if err != nil {
		t.Fatalf("PS() = %v", err)
	}
	tagged := 0
	for _, p := range all {
		if p.Session == id {
			tagged++
		}
	}
	if tagged != 2 || len(all) <= len(only) {
		t.Errorf("PS() = %d rows, %d tagged %s; want more rows than the session's, 2 tagged", len(all), tagged, id)
	}
}

// TestPidDirPinsProcess: a /proc/P opened before P exits does not read
// another process after P is reaped.
func TestPidDirPinsProcess(t *testing.T) {
	c := exec.Command("sleep", "1081")
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		t.Skipf("starting sleep: %v", err)
	}
	p := procFS{dir: "/proc"}
	d, err := p.openPID(c.Process.Pid)
	if err != nil {
		t.Fatalf("openPID(%d) = %v", c.Process.Pid, err)
	}
	defer d.close()
	if b, err := d.read("stat", nil); err != nil || !strings.Contains(string(b), "(sleep)") {
		t.Fatalf("read(stat) = %q, %v; want the sleep's stat", b, err)
	}
	_ = c.Process.Kill()
	_ = c.Wait()
	if b, err := d.read("stat", nil); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("read(stat) after exit = %q, %v; want ESRCH", b, err)
	}
	if _, err := p.openPID(c.Process.Pid); !errors.Is(err, errNoProcess) {
		t.Errorf("openPID(reaped) = %v; want errNoProcess", err)
	}
}

// workerName drops the work item a kernel worker names itself after
// ("kworker/1:2-events" → "kworker/1:2"): it changes with every item the
// worker picks up, so even a worker that reads the same before and after
// the scan may have shown another item in between.
func workerName(name string) string {
	if rest, ok := strings.CutPrefix(name, "kworker/"); ok {
		// The kernel appends the work it runs: "-" while idle after it,
		// "+" while running it (kworker/u8:3+flush-254:0).
		if i := strings.IndexAny(rest, "-+"); i >= 0 {
			rest = rest[:i]
		}
		return "kworker/" + rest
	}
	return name
}

func TestStatusUID(t *testing.T) {
	tests := []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\n", 1000, true},
		{"Uid:\t0\t0\t0\t0\n", 0, true},
		{"Name:\tx\nUid:\t4294967295\t0\t0\t0", 4294967295, true},
		{"Name:\tx\n", 0, false},
		{"Name:\tUid:\t7\n", 0, false},
		{"Name:\tx\nUid:\n", 0, false},
		{"Name:\tx\nUid:\t-1\t0\n", 0, false},
		{"Name:\tx\nUid:\t4294967296\t0\n", 0, false},
		{"Name:\tx\nUid:\tabc\t0\n", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := statusUID([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("statusUID(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCmdlineString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"sh\x00-c\x00sleep 5\x00", "sh -c sleep 5"},
		{"", ""},
		{"\x00\x00", ""},
		{"a\x00\x00b\x00", "a  b"},
		{"title set by setproctitle", "title set by setproctitle"},
	}
	for _, tt := range tests {
		if got := cmdlineString([]byte(tt.in)); got != tt.want {
			t.Errorf("cmdlineString(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestParsePasswd(t *testing.T) {
	in := strings.Join([]string{
		"root:x:0:0:root:/root:/bin/sh",
		"  # comment:x:1:1:::",
		"",
		"+nis:x:2:2:::",
		"-nis:x:3:3:::",
		":x:4:4:::",
		"short:x:5:5:",
		"baduid:x:five:5:::",
		"badgid:x:6:six:::",
		"first:x:7:7:::",
		"second:x:7:7:::",
		"  spaced:x:8:8:gecos,more:/h:/bin/sh  ",
	}, "\n")
	want := map[string]string{"0": "root", "7": "first", "8": "spaced"}
	if got := parsePasswd(strings.NewReader(in)); !maps.Equal(got, want) {
		t.Errorf("parsePasswd() = %v; want %v", got, want)
	}
}

func TestUserNames(t *testing.T) {
	f := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(f, []byte("alice:x:4321:4321::/home/alice:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := userNames{file: f}
	if got := u.name(4321); got != "alice" {
		t.Errorf("name(4321) = %q; want alice", got)
	}
	// Read once: a change to the file is not seen within the scan.
	if err := os.WriteFile(f, []byte("bob:x:4321:4321::/home/bob:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := u.name(4321); got != "alice" {
		t.Errorf("name(4321) after rewrite = %q; want alice (cached)", got)
	}
	if got := u.name(3999999999); got != "3999999999" {
		t.Errorf("name(3999999999) = %q; want the number", got)
	}
	missing := userNames{file: filepath.Join(t.TempDir(), "none")}
	if got := missing.name(3999999998); got != "3999999998" {
		t.Errorf("name(3999999998) with no passwd = %q; want the number", got)
	}
}

func TestParseStatHostile(t *testing.T) {
	tests := []string{
		"99999999999 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0",
		"+5 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0",
		"5 (a) S 1 1 1 0 -1 -4 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0",
		"5 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99999999999999999999999 0 0 0",
		"5 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 x 0",
		"5 (a)",
		"5 (a) \n\n\n",
		"5 )a( S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0",
	}
	for _, in := range tests {
		if got, err := parseStat([]byte(in)); err == nil {
			t.Errorf("parseStat(%q) = %+v, nil; want an error", in, got)
		}
	}
	// The slow path still takes numbers too long for the fast one.
	got, err := parseStat([]byte("5 (a) S 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 0 0 0 20 0 1 0 5 0 -3 0"))
	if err != nil || got.UTime != 18446744073709551615 || got.RSSPages != -3 {
		t.Errorf("parseStat(big utime, negative rss) = %+v, %v; want utime 2^64-1, rss -3", got, err)
	}
}
