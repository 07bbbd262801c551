//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/guest/mux"
	"golang.org/x/sys/unix"
)

func TestRingCursor(t *testing.T) {
	type read struct {
		since                 int64
		max                   int
		data                  string
		offset, next, dropped int64
		more                  bool
	}
	tests := []struct {
		name   string
		size   int
		writes []string
		reads  []read
	}{
		{"empty", 4, nil, []read{{since: 0, max: 10, data: ""}}},
		{"fits", 8, []string{"abc", "de"}, []read{
			{since: 0, max: 10, data: "abcde", next: 5},
			{since: 2, max: 10, data: "cde", offset: 2, next: 5},
			{since: 5, max: 10, data: "", offset: 5, next: 5},
			{since: 1, max: 2, data: "bc", offset: 1, next: 3, more: true},
			{since: 99, max: 10, data: "", offset: 5, next: 5},
		}},
		{"wraps", 4, []string{"abc", "def", "g"}, []read{
			{since: 0, max: 10, data: "defg", offset: 3, next: 7, dropped: 3},
			{since: 4, max: 10, data: "efg", offset: 4, next: 7},
			{since: 4, max: 2, data: "ef", offset: 4, next: 6, more: true},
		}},
		{"one write larger than the ring", 4, []string{"ab", "cdefghij"}, []read{
			{since: 0, max: 10, data: "ghij", offset: 6, next: 10, dropped: 6},
			{since: 8, max: 10, data: "ij", offset: 8, next: 10},
		}},
		{"fill exactly then wrap", 3, []string{"abc", "d"}, []read{{since: 0, max: 10, data: "bcd", offset: 1, next: 4, dropped: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(tt.size, nil)
			for _, w := range tt.writes {
				r.Write([]byte(w))
			}
			for _, rd := range tt.reads {
				got := r.read(rd.since, rd.max)
				if string(got.Data) != rd.data || got.Offset != rd.offset || got.Next != rd.next || got.Dropped != rd.dropped || got.More != rd.more {
					t.Errorf("read(%d, %d) = %q offset %d next %d dropped %d more %v; want %q %d %d %d %v",
						rd.since, rd.max, got.Data, got.Offset, got.Next, got.Dropped, got.More, rd.data, rd.offset, rd.next, rd.dropped, rd.more)
				}
			}
		})
	}
}

// TestRingStreamedRead: a reader following the cursor sees every byte once,
// in order, while the ring holds them, and is told exactly how many it missed.
func TestRingStreamedRead(t *testing.T) {
	r := newRing(64, nil)
	var written, seen bytes.Buffer
	var cursor, dropped int64
	for i := range 500 {
		w := []byte(fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", i%40)))
		r.Write(w)
		written.Write(w)
		if i%7 == 0 || i%11 == 0 {
			o := r.read(cursor, 1000)
			dropped += o.Dropped
			seen.Write(bytes.Repeat([]byte{'?'}, int(o.Dropped)))
			seen.Write(o.Data)
			cursor = o.Next
		}
	}
	o := r.read(cursor, 1000)
	dropped += o.Dropped
	seen.Write(bytes.Repeat([]byte{'?'}, int(o.Dropped)))
	seen.Write(o.Data)
	if seen.Len() != written.Len() {
		t.Fatalf("bytes seen + dropped = %d; want %d written", seen.Len(), written.Len())
	}
	for i, b := range seen.Bytes() {
		if b != '?' && b != written.Bytes()[i] {
			t.Fatalf("byte %d = %q; want %q (nothing repeated or shifted)", i, b, written.Bytes()[i])
		}
	}
	if dropped == 0 || o.DroppedTotal != int64(written.Len())-64 {
		t.Errorf("dropped %d, DroppedTotal %d; want some dropped, %d in all", dropped, o.DroppedTotal, written.Len()-64)
	}
}

func TestRingLastLine(t *testing.T) {
	tests := []struct {
		writes []string
		want   string
	}{
		{[]string{"a\nb\n"}, "b"},
		{[]string{"a\nb\n\n\n"}, "b"},
		{[]string{"a\nhalf"}, "half"},
		{[]string{"progress 10%\r", "progress 20%\r"}, "progress 20%"},
		{[]string{strings.Repeat("é", 600)}, strings.Repeat("é", 256)},
		{nil, ""},
	}
	for _, tt := range tests {
		r := newRing(8192, nil)
		for _, w := range tt.writes {
			r.Write([]byte(w))
		}
		if got := r.lastLine(); got != tt.want {
			t.Errorf("lastLine after %q = %q; want %q", tt.writes, got, tt.want)
		}
	}
}

// served is a resident helper serving in the test process.
type served struct {
	a      *Agent
	socket string
	cancel context.CancelFunc
	done   chan error
}

func serveForTest(t *testing.T, root string) *served {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: root, ProcDir: "/proc", Self: self, Grace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{a: a, socket: SocketPath(root), cancel: cancel, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		s.done <- a.Serve(ctx, ServeOptions{KeepProcess: true, Ready: func(wire.Hello) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-s.done:
		t.Fatalf("Serve() = %v before it listened", err)
	}
	t.Cleanup(s.stop)
	return s
}

func (s *served) stop() {
	s.cancel()
	<-s.done
	s.done <- nil
}

// call sends a command line to the helper through its socket and decodes
// the reply's result into out.
func (s *served) call(t *testing.T, args []string, stdin []byte, out any) error {
	t.Helper()
	c, err := net.Dial("unix", s.socket)
	if err != nil {
		t.Fatalf("dial %s: %v", s.socket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, _, err := mux.Dial(ctx, c)
	if err != nil {
		t.Fatalf("mux.Dial() = %v", err)
	}
	defer cl.Close()
	rep, err := cl.Call(ctx, mux.Request{Args: args, Stdin: stdin})
	if err != nil {
		t.Fatalf("Call(%q) = %v", args, err)
	}
	var r struct {
		OK     bool            `json:"ok"`
		Result json.RawMessage `json:"result"`
		Error  *wire.Error     `json:"error"`
	}
	if err := json.Unmarshal(rep.Stdout, &r); err != nil {
		t.Fatalf("reply to %q: %v: %q", args, err, rep.Stdout)
	}
	if !r.OK {
		return r.Error
	}
	if out != nil {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}

func runJSON(t *testing.T, req wire.RunRequest) []byte {
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeAnswersAsTheCLI(t *testing.T) {
	s := serveForTest(t, t.TempDir())
	var h wire.Hello
	if err := s.call(t, []string{"hello"}, nil, &h); err != nil || !h.Resident || h.PID != os.Getpid() || len(h.SHA256) != 64 || h.Proto != wire.Proto {
		t.Errorf("hello = %+v, %v; want resident, this pid, a sha256, proto %d", h, err, wire.Proto)
	}
	var res wire.RunResult
	if err := s.call(t, []string{"run"}, runJSON(t, wire.RunRequest{Shell: "echo out; echo err >&2; exit 3"}), &res); err != nil ||
		string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 {
		t.Errorf("run = %+v, %v; want out, err, exit 3", res, err)
	}
	// The same error reply as the CLI's.
	var we *wire.Error
	if err := s.call(t, []string{"nonsense"}, nil, nil); !errors.As(err, &we) || we.Code != wire.CodeInvalid {
		t.Errorf("unknown command = %v; want %s", err, wire.CodeInvalid)
	}
	// Concurrent calls on their own connections.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r wire.RunResult
			if err := s.call(t, []string{"run"}, runJSON(t, wire.RunRequest{Argv: []string{"echo", strconv.Itoa(i)}}), &r); err != nil || string(r.Stdout) != fmt.Sprintf("%d\n", i) {
				t.Errorf("concurrent run %d = %q, %v", i, r.Stdout, err)
			}
		}()
	}
	wg.Wait()
}

func TestJobsNeedTheResidentHelper(t *testing.T) {
	a, err := New(Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := a.Main(context.Background(), []string{"job", "list"}, nil, &out); code != 1 || !strings.Contains(out.String(), wire.ReasonNotResident) {
		t.Errorf("job list per command = %d %s; want 1 and %q", code, out.String(), wire.ReasonNotResident)
	}
}

// TestJobStreamsOutput: a job's output is read while it runs, from a
// cursor: nothing lost, nothing repeated; the end's status is final.
func TestJobStreamsOutput(t *testing.T) {
	s := serveForTest(t, t.TempDir())
	gate := filepath.Join(t.TempDir(), "gate")
	// Prints a line, then waits for the test to open the gate, then more.
	shell := fmt.Sprintf(`echo first; while [ ! -e %s ]; do sleep 0.01; done; for i in 1 2 3; do echo line $i; done; echo oops >&2; exit 7`, gate)
	var st wire.JobStarted
	if err := s.call(t, []string{"job", "start"}, runJSON(t, wire.RunRequest{Shell: shell, TimeoutMS: 60000}), &st); err != nil {
		t.Fatalf("job start = %v", err)
	}
	if wire.ValidateJobID(st.ID) != nil || st.PID <= 1 {
		t.Fatalf("job start = %+v; want an id and a pid", st)
	}
	var js wire.JobStatus
	if err := s.call(t, []string{"job", "status", "--id", st.ID, "--wait-ms", "20000"}, nil, &js); err != nil {
		t.Fatal(err)
	}
	if js.State != wire.JobRunning || string(js.Stdout.Data) != "first\n" || js.LastLine != "first" {
		t.Fatalf("status while running = %+v; want running, %q", js, "first\n")
	}
	cursor := js.Stdout.Next
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	got.Write(js.Stdout.Data)
	for js.State == wire.JobRunning {
		if err := s.call(t, []string{"job", "status", "--id", st.ID, "--stdout-since", strconv.FormatInt(cursor, 10), "--wait-ms", "20000"}, nil, &js); err != nil {
			t.Fatal(err)
		}
		if js.Stdout.Offset != cursor || js.Stdout.Dropped != 0 {
			t.Fatalf("status from %d starts at %d, dropped %d; want %d, 0", cursor, js.Stdout.Offset, js.Stdout.Dropped, cursor)
		}
		got.Write(js.Stdout.Data)
		cursor = js.Stdout.Next
	}
	if want := "first\nline 1\nline 2\nline 3\n"; got.String() != want || js.State != wire.JobExited || js.ExitCode != 7 || string(js.Stderr.Data) != "oops\n" {
		t.Errorf("streamed %q, final %+v; want %q, exited 7, stderr oops", got.String(), js, want)
	}
	var list []wire.JobStatus
	if err := s.call(t, []string{"job", "list"}, nil, &list); err != nil || len(list) != 1 || list[0].ID != st.ID || list[0].Stdout.Total != int64(len("first\nline 1\nline 2\nline 3\n")) {
		t.Errorf("job list = %+v, %v; want the one job with its counts", list, err)
	}
}

// TestJobWrapsAndCancels: a job writing more than its buffer reports the
// bytes it dropped; cancel ends its tree.
func TestJobWrapsAndCancels(t *testing.T) {
	s := serveForTest(t, t.TempDir())
	var st wire.JobStarted
	req := wire.RunRequest{Shell: `head -c 100000 /dev/zero | tr '\0' x; echo; echo done; sleep 1000 & sleep 1000`, MaxOutputBytes: 4096, TimeoutMS: 60000}
	if err := s.call(t, []string{"job", "start"}, runJSON(t, req), &st); err != nil {
		t.Fatal(err)
	}
	var js wire.JobStatus
	for js.LastLine != "done" {
		if err := s.call(t, []string{"job", "status", "--id", st.ID, "--wait-ms", "1000"}, nil, &js); err != nil {
			t.Fatal(err)
		}
	}
	if js.Stdout.Total != 100006 || js.Stdout.Dropped != 100006-4096 || len(js.Stdout.Data) != 4096 || js.Stdout.Offset != js.Stdout.Dropped {
		t.Errorf("stdout = total %d dropped %d, %d bytes from %d; want 100006, %d, 4096 from the same", js.Stdout.Total, js.Stdout.Dropped, len(js.Stdout.Data), js.Stdout.Offset, 100006-4096)
	}
	var end wire.JobStatus
	if err := s.call(t, []string{"job", "cancel", "--id", st.ID}, nil, &end); err != nil {
		t.Fatal(err)
	}
	if end.State != wire.JobExited || !end.Canceled || end.TimedOut || end.Killed < 2 {
		t.Errorf("cancel = %+v; want exited, canceled, not timed out, its tree (2+ processes) killed", end)
	}
	if out, _ := exec.Command("pgrep", "-f", "sleep 1000").Output(); len(out) != 0 {
		t.Errorf("pgrep sleep 1000 after cancel = %q; want none", out)
	}
}

// TestJobsOutliveAHostButNotTheHelper: a job is found again by a new
// connection; a helper that ended while it ran leaves it lost, its
// processes ended, and the next helper says so.
func TestJobsOutliveAHostButNotTheHelper(t *testing.T) {
	root := t.TempDir()
	s := serveForTest(t, root)
	var done, running wire.JobStarted
	if err := s.call(t, []string{"job", "start"}, runJSON(t, wire.RunRequest{Shell: "echo kept"}), &done); err != nil {
		t.Fatal(err)
	}
	var js wire.JobStatus
	for js.State != wire.JobExited {
		if err := s.call(t, []string{"job", "status", "--id", done.ID, "--wait-ms", "1000"}, nil, &js); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.call(t, []string{"job", "start"}, runJSON(t, wire.RunRequest{Shell: "echo started; exec sleep 1001", TimeoutMS: 60000}), &running); err != nil {
		t.Fatal(err)
	}
	// The helper ends as if killed: its record of the running job says
	// running (the stop below rewrites it, so keep the one from the start).
	rec, err := os.ReadFile(filepath.Join(root, "jobs", running.ID+jobRecordSuffix))
	if err != nil {
		t.Fatal(err)
	}
	// A process of the job survives the helper (as one that left its
	// process group would): the next helper must end it.
	orphan := exec.Command("sleep", "1002")
	orphan.Env = []string{RunEnv + "=" + jobRunID(t, rec)}
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	orphanDone := make(chan struct{})
	go func() { _ = orphan.Wait(); close(orphanDone) }()
	s.stop()
	if err := os.WriteFile(filepath.Join(root, "jobs", running.ID+jobRecordSuffix), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := serveForTest(t, root)
	var kept, lost wire.JobStatus
	if err := s2.call(t, []string{"job", "status", "--id", done.ID}, nil, &kept); err != nil || kept.State != wire.JobExited || string(kept.Stdout.Data) != "kept\n" {
		t.Errorf("ended job after a restart = %+v, %v; want exited with its output", kept, err)
	}
	if err := s2.call(t, []string{"job", "status", "--id", running.ID}, nil, &lost); err != nil || lost.State != wire.JobLost || lost.Note == "" {
		t.Errorf("running job after a restart = %+v, %v; want lost, with a note", lost, err)
	}
	select {
	case <-orphanDone:
	case <-time.After(30 * time.Second):
		t.Errorf("the job's surviving process %d is still running after the new helper started", orphan.Process.Pid)
		orphan.Process.Kill()
	}
}

func jobRunID(t *testing.T, rec []byte) string {
	var r jobRecord
	if err := json.Unmarshal(rec, &r); err != nil || r.RunID == "" {
		t.Fatalf("job record %s: %v", rec, err)
	}
	return r.RunID
}

func TestServeOnlyOnce(t *testing.T) {
	root := t.TempDir()
	serveForTest(t, root)
	a, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Serve(context.Background(), ServeOptions{KeepProcess: true, Socket: filepath.Join(t.TempDir(), "s.sock")})
	var already *AlreadyServingError
	if !errors.As(err, &already) || already.PID != os.Getpid() {
		t.Fatalf("second Serve() = %v; want AlreadyServingError naming pid %d", err, os.Getpid())
	}
}

// TestServeSocketPrivate: the socket is 0600 in a 0700 directory, and a
// process of another uid cannot connect; with both opened up by hand, the
// helper still closes a connection whose peer is not root, unanswered.
func TestServeSocketPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (switches to another uid)")
	}
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	s := serveForTest(t, root)
	dir := filepath.Dir(s.socket)
	for p, want := range map[string]os.FileMode{s.socket: 0o600, dir: 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("mode of %s = %v, %v; want %#o", p, fi.Mode().Perm(), err, want)
		}
	}
	client := copyTestBinary(t)
	steps := []struct {
		name string
		open func() error
		want string
	}{
		{"as served", func() error { return nil }, "refused 13"},
		{"directory opened", func() error { return os.Chmod(dir, 0o711) }, "refused 13"},
		{"socket opened too", func() error { return os.Chmod(s.socket, 0o666) }, "closed"},
	}
	for _, st := range steps {
		if err := st.open(); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(client, "-test.run=^TestConnectAsChild$")
		cmd.Env = append(os.Environ(), connectEnv+"="+s.socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != st.want {
			t.Errorf("%s: connect as uid 65534 = %q, %v; want %q", st.name, out, err, st.want)
		}
	}
}

// connectEnv makes TestConnectAsChild, in a copy of the test binary run as
// another uid, connect to the socket it names and print what happened.
const connectEnv = "VMGATE_TEST_CONNECT"

func TestConnectAsChild(t *testing.T) {
	p := os.Getenv(connectEnv)
	if p == "" {
		return // only as the child of TestServeSocketPrivate
	}
	c, err := net.Dial("unix", p)
	if err != nil {
		var errno syscall.Errno
		errors.As(err, &errno)
		fmt.Printf("refused %d\n", int(errno))
		os.Exit(0)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write([]byte{1, 0})
	if n, _ := c.Read(make([]byte, 1)); n == 0 {
		fmt.Println("closed")
	} else {
		fmt.Println("answered")
	}
	os.Exit(0)
}

// copyTestBinary copies this test binary where any uid can run it.
func copyTestBinary(t *testing.T) string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "client")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeReplaceOnlyAHelper(t *testing.T) {
	root := t.TempDir()
	serveForTest(t, root) // held by the test binary, not a vmgate-guest
	a, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Serve(context.Background(), ServeOptions{KeepProcess: true, Replace: true, Socket: filepath.Join(t.TempDir(), "s.sock")})
	if err == nil || !strings.Contains(err.Error(), "is not a vmgate-guest") {
		t.Fatalf("Serve(Replace) with the lock held by a test binary = %v; want a refusal", err)
	}
}

// TestJobOutlivesItsCallersThread: a job started from a goroutine locked
// to an OS thread that then exits (as the sandbox's, writeBlocked's and
// the network namespace's threads do) keeps running: its fork happened on
// the helper's one thread that never exits, so its parent-death signal
// does not fire with the caller's thread.
func TestJobOutlivesItsCallersThread(t *testing.T) {
	s := serveForTest(t, t.TempDir())
	gate := filepath.Join(t.TempDir(), "gate")
	shell := fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.01; done; echo survived`, gate)
	type started struct {
		st  wire.JobStarted
		tid int
		err error
	}
	// The runtime parks the process's main thread instead of ending it:
	// a goroutine that finds itself there gives it back and tries again.
	var got started
	for got.tid == 0 {
		done := make(chan started, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the runtime ends this thread when the goroutine returns
			if unix.Gettid() == os.Getpid() {
				runtime.UnlockOSThread()
				done <- started{}
				return
			}
			st, err := s.a.res.jobs.start(wire.RunRequest{Shell: shell, TimeoutMS: 60000})
			done <- started{st, unix.Gettid(), err}
		}()
		got = <-done
	}
	if got.err != nil {
		t.Fatalf("job start = %v", got.err)
	}
	task := fmt.Sprintf("/proc/self/task/%d", got.tid)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 30 s after its locked goroutine returned", task)
		}
		runtime.Gosched()
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var js wire.JobStatus
	for js.State == "" || js.State == wire.JobRunning {
		if err := s.call(t, []string{"job", "status", "--id", got.st.ID, "--wait-ms", "20000"}, nil, &js); err != nil {
			t.Fatal(err)
		}
	}
	if js.State != wire.JobExited || js.ExitCode != 0 || string(js.Stdout.Data) != "survived\n" {
		t.Errorf("job after its caller's thread exited = %+v; want exited 0 with %q", js, "survived\n")
	}
}

// TestSessionDestroyEndsItsJobs: a session's destroy ends its jobs, each
// saying so (canceled, with the reason) by the time the destroy answers,
// not as if a signal came from nowhere; so does a destroy run by a process
// per command, which asks the resident helper through its socket.
func TestSessionDestroyEndsItsJobs(t *testing.T) {
	for _, perCommand := range []bool{false, true} {
		t.Run(fmt.Sprintf("per command %v", perCommand), func(t *testing.T) {
			root := t.TempDir()
			s := serveForTest(t, root)
			id := "0123456789abcdef0123456789abcd01"
			if err := s.call(t, []string{"session", "create", "--id", id}, nil, nil); err != nil {
				t.Fatalf("session create = %v", err)
			}
			var st wire.JobStarted
			if err := s.call(t, []string{"job", "start"}, runJSON(t, wire.RunRequest{Session: id, Shell: "echo up; sleep 1001", TimeoutMS: 60000}), &st); err != nil {
				t.Fatal(err)
			}
			var js wire.JobStatus
			for js.LastLine != "up" {
				if err := s.call(t, []string{"job", "status", "--id", st.ID, "--wait-ms", "1000"}, nil, &js); err != nil {
					t.Fatal(err)
				}
			}
			destroy := []string{"session", "destroy", "--id", id}
			if perCommand {
				self, _ := os.Executable()
				a, err := New(Config{Root: root, ProcDir: "/proc", Self: self, Grace: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				if code := a.Main(context.Background(), destroy, nil, &out); code != 0 {
					t.Fatalf("session destroy per command = %d, %s", code, out.Bytes())
				}
			} else if err := s.call(t, destroy, nil, nil); err != nil {
				t.Fatalf("session destroy = %v", err)
			}
			if err := s.call(t, []string{"job", "status", "--id", st.ID}, nil, &js); err != nil {
				t.Fatal(err)
			}
			if js.State != wire.JobExited || !js.Canceled || !strings.Contains(js.Note, "session was destroyed") {
				t.Errorf("the job after its session's destroy = %+v; want exited, canceled, saying its session was destroyed", js)
			}
			if err := syscall.Kill(st.PID, 0); err == nil {
				t.Errorf("the job's process %d runs on after its session's destroy", st.PID)
			}
		})
	}
}

// TestJobRecoveryKillsOnlyTheJob: a record of a job that was running when
// its helper ended names a pid; the next helper ends that pid's process
// group and descendants only while the process there is the job's own
// (its start time the record's), never a process that has the number now
// (a guest that rebooted, a pid reused).
func TestJobRecoveryKillsOnlyTheJob(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ownStart   bool // the record's start time is the process's
		wantKilled bool
	}{
		{"the pid reused by another process", false, false},
		{"the job's own process, still running", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			a := hostAgent(t)
			// Its own group leader without the job's marker: only the
			// record's pid reaches it.
			p := exec.Command("sleep", "1004")
			p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Process.Kill(); _ = p.Wait() }()
			started := a.processStartMS(p.Process.Pid, time.Time{})
			if !tc.ownStart {
				started -= 3_600_000
			}
			id := randomHex(12)
			rec, err := json.Marshal(jobRecord{RunID: randomHex(12), Status: wire.JobStatus{
				ID: id, State: wire.JobRunning, PID: p.Process.Pid, StartedAt: started}})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "jobs"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "jobs", id+jobRecordSuffix), rec, 0o600); err != nil {
				t.Fatal(err)
			}
			s := serveForTest(t, root) // ready once the records are recovered
			var lost wire.JobStatus
			if err := s.call(t, []string{"job", "status", "--id", id}, nil, &lost); err != nil || lost.State != wire.JobLost {
				t.Errorf("job after a restart = %+v, %v; want lost", lost, err)
			}
			st, err := a.proc.stat(p.Process.Pid) // not reaped yet: a killed one is a zombie
			if killed := err != nil || st.State == "Z"; killed != tc.wantKilled {
				t.Errorf("process %d at the record's pid killed = %v (%+v, %v); want %v", p.Process.Pid, killed, st.State, err, tc.wantKilled)
			}
		})
	}
}
