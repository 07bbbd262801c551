//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		in      string
		want    procStat
		wantErr bool
	}{
		{in: "4242 (my (odd) prog) R 1 4242 4242 0 -1 4194304 10 0 0 0 150 50 0 0 20 0 1 0 12345 9000000 256 0",
			want: procStat{PID: 4242, Comm: "my (odd) prog", State: "R", PPID: 1, PGRP: 4242, Flags: 4194304, UTime: 150, STime: 50, StartTime: 12345, RSSPages: 256}},
		{in: "7 () S 2 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0",
			want: procStat{PID: 7, Comm: "", State: "S", PPID: 2, Flags: 2129984, StartTime: 5}},
		{in: "", wantErr: true},
		{in: "12 comm S 1", wantErr: true},
		{in: "x (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", wantErr: true},
		{in: "5 (a) S 1 1 1", wantErr: true},
		{in: "5 (a) SS 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", wantErr: true},
		{in: "5 (a) S one 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", wantErr: true},
		{in: "-5 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseStat([]byte(tt.in))
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestKernelThread(t *testing.T) {
	tests := []struct {
		st   procStat
		want bool
	}{
		{procStat{PID: 2, PPID: 0}, true},
		{procStat{PID: 50, PPID: 2, Flags: pfKthread}, true},
		{procStat{PID: 50, PPID: 1, Flags: 4194304}, false},
		{procStat{PID: 1, PPID: 0}, false},
	}
	for _, tt := range tests {
		if got := tt.st.KernelThread(); got != tt.want {
			t.Errorf("%+v.KernelThread() = %v; want %v", tt.st, got, tt.want)
		}
	}
}

func fixtureAgent(t *testing.T) *Agent {
	t.Helper()
	a, err := New(Config{Root: t.TempDir(), ProcDir: "testdata/proc"})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	return a
}

// fixtureToken is the secret in the marker of fixture process 4242.
const fixtureToken = "00112233445566778899aabbccddeeff"

// withSession writes metadata for a session id with token, as create would.
func withSession(t *testing.T, a *Agent, id, token string) {
	t.Helper()
	if err := os.MkdirAll(a.metaDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := a.writeMetaLocked(meta{Session: wire.Session{ID: id}, Token: token}); err != nil {
		t.Fatal(err)
	}
}

func TestPSFixture(t *testing.T) {
	a := fixtureAgent(t)
	withSession(t, a, "0123456789abcdef", fixtureToken)
	ps, err := a.PS(context.Background(), "")
	if err != nil {
		t.Fatalf("PS() = %v; want nil", err)
	}
	byPID := map[int32]wire.Process{}
	for _, p := range ps {
		byPID[p.PID] = p
	}
	if len(ps) != 4 {
		t.Fatalf("PS() = %d rows; want 4: %+v", len(ps), ps)
	}
	p := byPID[4242]
	want := wire.Process{PID: 4242, PPID: 1, User: p.User, Name: "my (odd) prog", Cmdline: "sh -c sleep 5",
		StartedAt: 1700000000*1000 + 12345*10, State: "R", RSSBytes: 256 * uint64(os.Getpagesize()),
		CPUPercent: p.CPUPercent, Session: "0123456789abcdef"}
	if p != want {
		t.Errorf("PS()[4242] = %+v; want %+v", p, want)
	}
	if p.User == "" || p.CPUPercent <= 0 {
		t.Errorf("PS()[4242] user %q cpu %v; want a user and cpu > 0", p.User, p.CPUPercent)
	}
	if got := byPID[77].Session; got != "aaaaaaaaaaaaaaaabbbb" {
		t.Errorf("PS()[77].Session = %q; want the cgroup's session", got)
	}
	if got := byPID[2]; got.Cmdline != "" || got.Session != "" {
		t.Errorf("PS()[2] = %+v; want no cmdline, no session", got)
	}
	only, err := a.PS(context.Background(), "0123456789abcdef")
	if err != nil || len(only) != 1 || only[0].PID != 4242 {
		t.Errorf("PS(session) = %+v, %v; want only pid 4242", only, err)
	}
	if _, err := a.PS(context.Background(), "../etc"); !isCode(err, wire.CodeInvalid) {
		t.Errorf("PS(../etc) = %v; want invalid_argument", err)
	}
}

// TestMarkerNeedsTheSecret: a process's VMGATE_SESSION marker makes it a
// member only with the session's secret; an id alone (what any exec can
// set) or another secret proves nothing. A session from before secrets
// (metadata without a token) still finds its bare-id processes.
func TestMarkerNeedsTheSecret(t *testing.T) {
	tests := []struct {
		name  string
		token string // the session's token in its metadata; "-" for no metadata
		want  string
	}{
		{"the secret", fixtureToken, "0123456789abcdef"},
		{"another secret", "ffeeddccbbaa99887766554433221100", ""},
		{"a prefix of it", fixtureToken[:31], ""},
		{"no such session", "-", ""},
		{"legacy session", "", ""}, // its processes carry the bare id, not this marker
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fixtureAgent(t)
			if tt.token != "-" {
				withSession(t, a, "0123456789abcdef", tt.token)
			}
			ps, err := a.PS(context.Background(), "")
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.PID == 4242 && p.Session != tt.want {
					t.Errorf("PS()[4242].Session = %q; want %q", p.Session, tt.want)
				}
			}
		})
	}
	ix := &sessionIndex{markers: map[string]string{"0123456789abcdef": "0123456789abcdef"}}
	for v, want := range map[string]string{"0123456789abcdef": "0123456789abcdef", "0123456789abcdef.x": "", "": "", ".": ""} {
		if got := ix.markerSession(v); got != want {
			t.Errorf("legacy markerSession(%q) = %q; want %q", v, got, want)
		}
	}
}

func TestEnvironAndCgroupParsing(t *testing.T) {
	tests := []struct {
		environ, key, want string
		ok                 bool
	}{
		{"A=1\x00VMGATE_SESSION=abc\x00", "VMGATE_SESSION", "abc", true},
		{"XVMGATE_SESSION=abc\x00", "VMGATE_SESSION", "", false},
		{"VMGATE_SESSION=\x00", "VMGATE_SESSION", "", true},
		{"", "VMGATE_SESSION", "", false},
	}
	for _, tt := range tests {
		got, ok := environValue([]byte(tt.environ), tt.key)
		if got != tt.want || ok != tt.ok {
			t.Errorf("environValue(%q, %q) = %q, %v; want %q, %v", tt.environ, tt.key, got, ok, tt.want, tt.ok)
		}
	}
	cg := []struct{ path, want string }{
		{"/vmgate/0123456789abcdef0123/run-x", "0123456789abcdef0123"},
		{"/vmgate/0123456789abcdef", "0123456789abcdef"},
		{"/vmgate/../etc/x", ""},
		{"/vmgatex/0123456789abcdef", ""},
		{"/user.slice", ""},
	}
	for _, tt := range cg {
		if got := sessionOfCgroup(tt.path); got != tt.want {
			t.Errorf("sessionOfCgroup(%q) = %q; want %q", tt.path, got, tt.want)
		}
	}
	if got := cgroupV2Path([]byte("12:pids:/x\n0::/vmgate/a\n")); got != "/vmgate/a" {
		t.Errorf("cgroupV2Path = %q; want /vmgate/a", got)
	}
}

func TestValidateSessionID(t *testing.T) {
	good := []string{"0123456789abcdef", strings.Repeat("a", 64), "deadbeefdeadbeef0000"}
	bad := []string{"", "../x", "../../../../etc", "-rf", "abc", strings.Repeat("a", 65), strings.Repeat("a", 15),
		"0123456789abcde*", "0123456789abcde?", "0123456789abcd[]", "0123456789ABCDEF", "0123456789abcde/",
		"0123456789abcde.", "0123456789abcde\x00", "0123456789abcdе0", // Cyrillic е
		"０123456789abcdef", // fullwidth zero
		"0123456789abcdef\n", " 0123456789abcdef", "0123456789-bcdef"}
	for _, id := range good {
		if err := wire.ValidateSessionID(id); err != nil {
			t.Errorf("ValidateSessionID(%q) = %v; want nil", id, err)
		}
	}
	for _, id := range bad {
		if err := wire.ValidateSessionID(id); !errors.Is(err, wire.ErrInvalidID) {
			t.Errorf("ValidateSessionID(%q) = %v; want ErrInvalidID", id, err)
		}
	}
}

func TestParseSignal(t *testing.T) {
	good := []struct {
		in   string
		name string
		num  int
	}{{"", "TERM", 15}, {"TERM", "TERM", 15}, {"sigkill", "KILL", 9}, {"SIGSTOP", "STOP", 19}, {"cont", "CONT", 18}, {"USR2", "USR2", 12}}
	for _, tt := range good {
		name, num, err := wire.ParseSignal(tt.in)
		if err != nil || name != tt.name || num != tt.num {
			t.Errorf("ParseSignal(%q) = %q, %d, %v; want %q, %d, nil", tt.in, name, num, err, tt.name, tt.num)
		}
	}
	for _, in := range []string{"9", "9; rm -rf /", "SEGV", "TERM ", "kıll", "ſIGTERM", "SIGSIGTERM", "-9", "TERM\x00", "ABRT"} {
		if _, _, err := wire.ParseSignal(in); !errors.Is(err, wire.ErrInvalidSignal) {
			t.Errorf("ParseSignal(%q) = %v; want ErrInvalidSignal", in, err)
		}
	}
}

func TestValidateRun(t *testing.T) {
	bad := []wire.RunRequest{
		{},
		{Argv: []string{"true"}, Shell: "true"},
		{Argv: []string{""}},
		{Argv: []string{"echo", "a\x00b"}},
		{Shell: "echo \x00"},
		{Argv: []string{"true"}, Cwd: "relative"},
		{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"1A": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"VMGATE_SESSION": "0123456789abcdef"}},
		{Argv: []string{"true"}, Env: map[string]string{"VMGATE_RUN": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"VMGATE_ANYTHING": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"A": "x\x00"}},
		{Argv: []string{"true"}, Session: "../../etc"},
		{Argv: []string{"true"}, TimeoutMS: -1},
		{Argv: []string{"true"}, TimeoutMS: wire.MaxRunTimeoutMS + 1},
		{Argv: []string{"true"}, MaxOutputBytes: -1},
		{Argv: []string{"true"}, MaxOutputBytes: wire.MaxOutputBytesLimit + 1},
	}
	for _, req := range bad {
		if err := validateRun(req); !isCode(err, wire.CodeInvalid) {
			t.Errorf("validateRun(%+v) = %v; want invalid_argument", req, err)
		}
	}
	if err := validateRun(wire.RunRequest{Argv: []string{"true"}, Env: map[string]string{"_A1": "x"}, Cwd: "/"}); err != nil {
		t.Errorf("validateRun(valid) = %v; want nil", err)
	}
}

func isCode(err error, code string) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Code == code
}

// hostAgent is an agent on the host's /proc with a temporary root and no
// cgroup: the marker tracking path.
func hostAgent(t testing.TB) *Agent {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: t.TempDir(), ProcDir: "/proc", Self: self, Grace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// procsWith lists host pids whose cmdline contains s.
func procsWith(t *testing.T, a *Agent, s string) []int {
	t.Helper()
	pids, _ := a.proc.pids()
	var out []int
	for _, p := range pids {
		st, err := a.proc.stat(p)
		if err != nil || st.State == "Z" {
			continue
		}
		if args, _ := a.proc.cmdline(p); strings.Contains(strings.Join(args, " "), s) {
			out = append(out, p)
		}
	}
	return out
}

func TestMain(m *testing.M) {
	// The test binary doubles as vmgate-guest's shims.
	if len(os.Args) > 1 && os.Args[1] == SandboxCommand {
		os.Exit(SandboxMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == ShimCommand {
		err := RlimitExec(os.Args[2:])
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(127)
	}
	os.Exit(m.Run())
}

func TestHostSessionLifecycle(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	id := "feedfacefeedface0001"
	s, err := a.SessionCreate(ctx, wire.SessionCreate{ID: id, TTLS: 60, Limits: wire.Limits{MemoryMB: 512}})
	if err != nil || s.Tracking != wire.TrackMarker {
		t.Fatalf("SessionCreate = %+v, %v; want marker tracking", s, err)
	}
	t.Cleanup(func() { _, _ = a.SessionDestroy(ctx, id) })
	if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: id}); !isCode(err, wire.CodeExists) {
		t.Errorf("second SessionCreate = %v; want exists", err)
	}
	if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: "feedfacefeedface0002", Limits: wire.Limits{CPUPercent: 50}}); !isCode(err, wire.CodeRefused) {
		t.Errorf("SessionCreate(cpu_percent, no cgroup) = %v; want refused", err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := a.Run(ctx, wire.RunRequest{Session: id, TimeoutMS: 10000,
		Shell: `ulimit -v; ln -s ` + outside + ` out && ln -s ` + outside + `/keep keep && ln -s / root && setsid sh -c "sleep 1040 &" ; sleep 1041 &`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Run = %+v, %v; want exit 0", res, err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "524288" {
		t.Errorf("ulimit -v in the session = %q; want 524288 (RLIMIT_AS from memory_mb)", got)
	}
	if got := procsWith(t, a, "sleep 104"); len(got) != 2 {
		t.Fatalf("session sleeps = %v; want 2", got)
	}
	list, err := a.SessionList(ctx)
	if err != nil || len(list) != 1 || list[0].Processes != 2 {
		t.Errorf("SessionList = %+v, %v; want one session with 2 processes", list, err)
	}
	d, err := a.SessionDestroy(ctx, id)
	if err != nil || !d.Existed || d.Killed != 2 {
		t.Errorf("SessionDestroy = %+v, %v; want existed, killed 2", d, err)
	}
	if got := procsWith(t, a, "sleep 104"); len(got) != 0 {
		t.Errorf("processes left after destroy: %v", got)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "x" {
		t.Errorf("file behind a symlink after destroy = %q, %v; want intact", b, err)
	}
	if _, err := os.Lstat(s.Workdir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workdir after destroy: %v; want gone", err)
	}
	d, err = a.SessionDestroy(ctx, id)
	if err != nil || d.Existed {
		t.Errorf("second SessionDestroy = %+v, %v; want existed false", d, err)
	}
	if _, err := a.Run(ctx, wire.RunRequest{Session: id, Argv: []string{"true"}}); !isCode(err, wire.CodeNotFound) {
		t.Errorf("Run in destroyed session = %v; want not_found", err)
	}
}

// idleSession creates session id with an idle limit of 60 s and moves its
// last use 61 s back, so it is idle past its limit.
func idleSession(t *testing.T, a *Agent, id string) {
	t.Helper()
	if _, err := a.SessionCreate(context.Background(), wire.SessionCreate{ID: id, IdleS: 60}); err != nil {
		t.Fatal(err)
	}
	m, err := a.readMeta(id)
	if err != nil {
		t.Fatal(err)
	}
	m.LastUsedMS -= 61_000
	if err := a.writeMetaLocked(m); err != nil {
		t.Fatal(err)
	}
}

func TestHostReap(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	old, fresh := "0000000000000000aaaa", "0000000000000000bbbb"
	idleSession(t, a, old)
	if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: fresh, IdleS: 60}); err != nil {
		t.Fatal(err)
	}
	r, err := a.SessionReap(ctx)
	if err != nil || len(r.Destroyed) != 1 || r.Destroyed[0].ID != old {
		t.Fatalf("SessionReap = %+v, %v; want only %s destroyed", r, err, old)
	}
	list, _ := a.SessionList(ctx)
	if len(list) != 1 || list[0].ID != fresh {
		t.Errorf("SessionList after reap = %+v; want only %s", list, fresh)
	}
}

// TestHostRunRecordsUse: a run in a session moves its last use (the idle
// limit's clock) to the run, now that it is recorded once the command has
// started rather than before, and a session idle past its limit is kept
// by that run.
func TestHostRunRecordsUse(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	id := "0000000000000000cccc"
	idleSession(t, a, id)
	before := time.Now().UnixMilli()
	if res, err := a.Run(ctx, wire.RunRequest{Session: id, Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("Run in session = %+v, %v; want exit 0", res, err)
	}
	if m, err := a.readMeta(id); err != nil || m.LastUsedMS < before {
		t.Errorf("after Run, LastUsedMS = %d, %v; want at least %d", m.LastUsedMS, err, before)
	}
	if r, err := a.SessionReap(ctx); err != nil || len(r.Destroyed) != 0 {
		t.Errorf("SessionReap after a run = %+v, %v; want nothing destroyed", r, err)
	}
}

func TestHostRunTimeoutKillsTree(t *testing.T) {
	a := hostAgent(t)
	res, err := a.Run(context.Background(), wire.RunRequest{TimeoutMS: 1000,
		Shell: `trap "" TERM; echo before; (trap "" TERM; sleep 1050) & setsid sh -c 'trap "" TERM; sleep 1051 & sleep 1052' & sleep 1053`})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !res.TimedOut || string(res.Stdout) != "before\n" || res.Killed < 4 {
		t.Errorf("Run = %+v; want timed out, stdout %q, killed >= 4", res, "before\n")
	}
	if got := procsWith(t, a, "sleep 105"); len(got) != 0 {
		t.Errorf("processes left after timeout: %v", got)
	}
}

func TestHostKillGuards(t *testing.T) {
	a := hostAgent(t)
	ctx := context.Background()
	cmd := exec.Command("sleep", "1060")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	pid := cmd.Process.Pid
	st, err := a.proc.stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	bt, _ := a.proc.bootTime()
	started := startMS(bt, st.StartTime)
	tests := []struct {
		pid     int
		sig     string
		started int64
		code    string
		reason  string
	}{
		{0, "TERM", 0, wire.CodeInvalid, ""},
		{-5, "TERM", 0, wire.CodeInvalid, ""},
		{1, "TERM", 0, wire.CodeRefused, wire.ReasonInit},
		{2, "KILL", 0, wire.CodeRefused, wire.ReasonKernelThread},
		{os.Getpid(), "KILL", 0, wire.CodeRefused, wire.ReasonSelf},
		{os.Getppid(), "KILL", 0, wire.CodeRefused, wire.ReasonAncestor},
		{pid, "9; rm -rf /", 0, wire.CodeInvalid, ""},
		{pid, "TERM", started - 10, wire.CodeRefused, wire.ReasonPidReused},
		{pid, "TERM", -1, wire.CodeInvalid, ""},
	}
	for _, tt := range tests {
		_, err := a.Kill(ctx, tt.pid, tt.sig, tt.started)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != tt.code || we.Reason != tt.reason {
			t.Errorf("Kill(%d, %q, %d) = %v; want %s %q", tt.pid, tt.sig, tt.started, err, tt.code, tt.reason)
		}
	}
	if s, _ := a.proc.stat(pid); s.State == "Z" {
		t.Fatalf("a refused kill ended pid %d", pid)
	}
	r, err := a.Kill(ctx, pid, "TERM", started)
	if err != nil || !r.Exited || r.Signal != "TERM" {
		t.Errorf("Kill(sleep) = %+v, %v; want exited", r, err)
	}
}

func TestMainReplies(t *testing.T) {
	a := fixtureAgent(t)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version", "--json"}, 0, `"ok":true`},
		{nil, 1, `"invalid_argument"`},
		{[]string{"frobnicate"}, 1, `"invalid_argument"`},
		{[]string{"ps", "--session", "../../etc"}, 1, `"invalid_argument"`},
		{[]string{"ps", "extra"}, 1, `"invalid_argument"`},
		{[]string{"kill", "--pid", "1"}, 1, `"pid 1 is init"`},
		{[]string{"kill", "--pid", "x"}, 1, `"invalid_argument"`},
		{[]string{"session", "destroy", "--id", "-rf"}, 1, `"invalid_argument"`},
		{[]string{"session", "create", "--id", "0123456789abcdef", "--memory-mb", "-1"}, 1, `"invalid_argument"`},
		{[]string{"run"}, 1, `"invalid_argument"`},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		code := a.Main(context.Background(), tt.args, strings.NewReader(`{"argv":["true"],"bogus":1}`), &out)
		var r wire.Reply
		if code != tt.code || json.Unmarshal(out.Bytes(), &r) != nil || !strings.Contains(out.String(), tt.want) || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("Main(%q) = %d, %q; want %d and one JSON line containing %s", tt.args, code, out.String(), tt.code, tt.want)
		}
	}
}
