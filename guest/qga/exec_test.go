package qga

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeCaller is a Caller whose replies come from reply; it records every call.
type fakeCaller struct {
	reply func(command string, args json.RawMessage) (any, error)

	mu    sync.Mutex // mu guards calls.
	calls []fakeCall
}

type fakeCall struct {
	command string
	args    string
	at      time.Time
}

func (f *fakeCaller) Call(ctx context.Context, command string, args, result any) error {
	b, err := json.Marshal(args)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{command, string(b), time.Now()})
	f.mu.Unlock()
	ret, err := f.reply(command, b)
	if err != nil {
		return err
	}
	if result == nil {
		return nil
	}
	rb, _ := json.Marshal(ret)
	return json.Unmarshal(rb, result)
}

func (f *fakeCaller) called(command string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.calls {
		if c.command == command {
			out = append(out, c)
		}
	}
	return out
}

// fakeFile serves one file through a fakeCaller as qemu-ga does:
// guest-file-open (mode "w..." empties it) starts reading at its first
// byte, guest-file-write appends, guest-file-read is fread then feof, so
// eof is true only on a read that came up short. pieces are the sizes
// written and asked for, reads the guest-file-read calls.
type fakeFile struct {
	data   []byte
	pos    int
	reads  int
	pieces []int
}

func (ff *fakeFile) caller() *fakeCaller {
	return &fakeCaller{reply: func(cmd string, args json.RawMessage) (any, error) {
		var a struct {
			Mode   string `json:"mode"`
			BufB64 string `json:"buf-b64"`
			Count  int    `json:"count"`
		}
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		switch cmd {
		case "guest-file-open":
			ff.pos = 0
			if strings.HasPrefix(a.Mode, "w") {
				ff.data = nil
			}
			return 5, nil
		case "guest-file-close":
			return map[string]any{}, nil
		case "guest-file-write":
			b, err := base64.StdEncoding.DecodeString(a.BufB64)
			if err != nil {
				return nil, err
			}
			ff.pieces = append(ff.pieces, len(b))
			ff.data = append(ff.data, b...)
			return map[string]any{"count": len(b), "eof": false}, nil
		case "guest-file-read":
			ff.reads++
			ff.pieces = append(ff.pieces, a.Count)
			n := min(a.Count, len(ff.data)-ff.pos)
			out := ff.data[ff.pos : ff.pos+n]
			ff.pos += n
			return map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(out), "eof": n < a.Count}, nil
		}
		return nil, errors.New("unexpected " + cmd)
	}}
}

func TestExecRequestRefused(t *testing.T) {
	tests := []struct {
		name string
		req  ExecRequest
	}{
		{"empty path", ExecRequest{}},
		{"NUL in path", ExecRequest{Path: "/bin/true\x00rm"}},
		{"NUL in arg", ExecRequest{Path: "echo", Args: []string{"a", "b\x00c"}}},
		{"env without =", ExecRequest{Path: "env", Env: []string{"FOO"}}},
		{"env empty key", ExecRequest{Path: "env", Env: []string{"=x"}}},
		{"env key option", ExecRequest{Path: "env", Env: []string{"-i=x"}}},
		{"env key with space", ExecRequest{Path: "env", Env: []string{"A B=x"}}},
		{"env key digit first", ExecRequest{Path: "env", Env: []string{"1A=x"}}},
		{"env NUL value", ExecRequest{Path: "env", Env: []string{"A=x\x00y"}}},
		{"path with = and env", ExecRequest{Path: "A=b", Env: []string{"X=1"}}},
		{"relative cwd", ExecRequest{Path: "pwd", Cwd: "tmp"}},
		{"cwd option", ExecRequest{Path: "pwd", Cwd: "-P"}},
		{"NUL in cwd", ExecRequest{Path: "pwd", Cwd: "/tmp\x00"}},
		{"negative timeout", ExecRequest{Path: "true", Timeout: -time.Second}},
		{"negative cap", ExecRequest{Path: "true", MaxOutputBytes: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCaller{reply: func(string, json.RawMessage) (any, error) { return map[string]any{"pid": 7}, nil }}
			a := Agent{Caller: f}
			if _, err := a.Exec(context.Background(), tt.req); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Exec(%+v) error %v; want ErrInvalidArgument", tt.req, err)
			}
			if len(f.calls) != 0 {
				t.Errorf("Exec(%+v) made %d calls; want none", tt.req, len(f.calls))
			}
		})
	}
}

func TestExecArguments(t *testing.T) {
	b, _ := json.Marshal(cwdScript)
	script := string(b)
	tests := []struct {
		name string
		req  ExecRequest
		want string
	}{
		{"argv", ExecRequest{Path: "echo", Args: []string{"a b", "$(x)"}},
			`{"path":"echo","arg":["a b","$(x)"],"capture-output":true}`},
		{"stdin", ExecRequest{Path: "cat", Stdin: []byte("hi")},
			`{"path":"cat","input-data":"aGk=","capture-output":true}`},
		{"env through env(1)", ExecRequest{Path: "-weird", Args: []string{"x"}, Env: []string{"A=1", "B_2=x=y"}},
			`{"path":"env","arg":["A=1","B_2=x=y","-weird","x"],"capture-output":true}`},
		{"cwd through sh, no interpolation", ExecRequest{Path: "ls", Args: []string{"-l"}, Cwd: "/tmp/a'b\"$(c)"},
			`{"path":"/bin/sh","arg":["-c",` + script + `,"sh","/tmp/a'b\"$(c)","ls","-l"],"capture-output":true}`},
		{"cwd and env", ExecRequest{Path: "pwd", Cwd: "/", Env: []string{"A=1"}},
			`{"path":"/bin/sh","arg":["-c",` + script + `,"sh","/","env","A=1","pwd"],"capture-output":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCaller{reply: func(string, json.RawMessage) (any, error) { return map[string]any{"pid": 7}, nil }}
			pid, err := Agent{Caller: f}.ExecStart(context.Background(), tt.req)
			if err != nil || pid != 7 {
				t.Fatalf("ExecStart(%+v) = %d, %v; want 7", tt.req, pid, err)
			}
			if got := f.called("guest-exec"); len(got) != 1 || got[0].args != tt.want {
				t.Errorf("ExecStart(%+v) sent %v; want %s", tt.req, got, tt.want)
			}
		})
	}
}

func TestExecStatusDecoding(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	tests := []struct {
		name    string
		reply   map[string]any
		max     int64
		want    ExecStatus
		wantErr error
	}{
		{name: "running", reply: map[string]any{"exited": false}, want: ExecStatus{PID: 5}},
		{name: "exit code and output", reply: map[string]any{"exited": true, "exitcode": 4, "out-data": b64([]byte("out")), "err-data": b64([]byte("err"))},
			want: ExecStatus{PID: 5, Exited: true, ExitCode: 4, Stdout: []byte("out"), Stderr: []byte("err")}},
		{name: "signal", reply: map[string]any{"exited": true, "signal": 9},
			want: ExecStatus{PID: 5, Exited: true, ExitCode: -1, Signal: 9}},
		{name: "our cap", max: 2, reply: map[string]any{"exited": true, "exitcode": 0, "out-data": b64([]byte("abc")), "err-data": b64([]byte("ab"))},
			want: ExecStatus{PID: 5, Exited: true, Stdout: []byte("ab"), Stderr: []byte("ab"), StdoutTruncated: true}},
		{name: "agent's cap", reply: map[string]any{"exited": true, "exitcode": 0, "out-data": b64([]byte("a")), "err-truncated": true},
			want: ExecStatus{PID: 5, Exited: true, Stdout: []byte("a"), StderrTruncated: true}},
		{name: "bad base64", reply: map[string]any{"exited": true, "exitcode": 0, "out-data": "!!!"}, wantErr: ErrProtocol},
		{name: "exited without status", reply: map[string]any{"exited": true}, wantErr: ErrProtocol},
		{name: "negative cap", max: -1, reply: map[string]any{"exited": false}, wantErr: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCaller{reply: func(string, json.RawMessage) (any, error) { return tt.reply, nil }}
			got, err := Agent{Caller: f}.ExecStatus(context.Background(), 5, tt.max)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("ExecStatus(%v) error %v; want %v", tt.reply, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ExecStatus(%v) = %+v, %v; want %+v", tt.reply, got, err, tt.want)
			}
		})
	}
}

// TestExecTimeoutPolling: a command that never exits on its own is polled
// adaptively, killed with its tree (KillTree) when its timeout fires, and
// reported TimedOut.
func TestExecTimeoutPolling(t *testing.T) {
	var mu sync.Mutex
	killed := false
	f := &fakeCaller{reply: func(cmd string, args json.RawMessage) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case cmd == "guest-exec" && strings.Contains(string(args), `"/bin/sh"`):
			killed = true
			return map[string]any{"pid": 99}, nil
		case cmd == "guest-exec":
			return map[string]any{"pid": 42}, nil
		case strings.Contains(string(args), "99"):
			return map[string]any{"exited": true, "exitcode": 0}, nil
		case killed:
			return map[string]any{"exited": true, "signal": 9, "out-data": base64.StdEncoding.EncodeToString([]byte("partial"))}, nil
		}
		return map[string]any{"exited": false}, nil
	}}
	const timeout = 300 * time.Millisecond
	st, err := Agent{Caller: f}.Exec(context.Background(), ExecRequest{Path: "sleep", Args: []string{"30"}, Timeout: timeout})
	if err != nil || !st.TimedOut || st.Signal != 9 || string(st.Stdout) != "partial" {
		t.Fatalf("Exec(timeout) = %+v, %v; want TimedOut, signal 9, partial output", st, err)
	}
	kills := f.called("guest-exec")
	if len(kills) != 2 || !strings.Contains(kills[1].args, `"path":"/bin/sh"`) || !strings.HasSuffix(kills[1].args, `"sh","42"],"capture-output":true}`) {
		t.Errorf("guest-exec calls = %v; want the command then the kill-tree script for pid 42", kills)
	}
	var polls []fakeCall
	for _, c := range f.called("guest-exec-status") {
		if strings.Contains(c.args, "42") {
			polls = append(polls, c)
		}
	}
	// 1+2+4+...+128 ms < 300 ms: at least 8 polls before the kill.
	if len(polls) < 8 {
		t.Fatalf("polls before timeout = %d; want at least 8 (adaptive polling)", len(polls))
	}
	first, last := polls[1].at.Sub(polls[0].at), polls[len(polls)-2].at.Sub(polls[len(polls)-3].at)
	if first >= last {
		t.Errorf("poll gaps: first %v, late %v; want growing gaps", first, last)
	}
}

// TestExecSettlesBeforeFirstPoll: the first guest-exec-status comes a
// settling pause (0.4 of guest-exec's round trip) after guest-exec
// answered, not at once: polls right after the start take the guest CPU
// the command needs to load.
func TestExecSettlesBeforeFirstPoll(t *testing.T) {
	const spawn = 25 * time.Millisecond
	var mu sync.Mutex
	var answered time.Time
	f := &fakeCaller{reply: func(cmd string, _ json.RawMessage) (any, error) {
		if cmd == "guest-exec" {
			time.Sleep(spawn) // a slow guest's fork and exec
			mu.Lock()
			answered = time.Now()
			mu.Unlock()
			return map[string]any{"pid": 42}, nil
		}
		return map[string]any{"exited": true, "exitcode": 0}, nil
	}}
	if st, err := (Agent{Caller: f}).Exec(context.Background(), ExecRequest{Path: "true"}); err != nil || !st.Exited {
		t.Fatalf("Exec = %+v, %v; want exited", st, err)
	}
	polls := f.called("guest-exec-status")
	mu.Lock()
	defer mu.Unlock()
	if len(polls) != 1 {
		t.Fatalf("guest-exec-status calls = %v; want one", polls)
	}
	if got, want := polls[0].at.Sub(answered), time.Duration(settleShare*float64(spawn)); got < want {
		t.Errorf("first guest-exec-status %v after guest-exec answered; want at least %v", got, want)
	}
}

func TestExecContextEnds(t *testing.T) {
	f := &fakeCaller{reply: func(cmd string, _ json.RawMessage) (any, error) {
		if cmd == "guest-exec" {
			return map[string]any{"pid": 42}, nil
		}
		return map[string]any{"exited": false}, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Agent{Caller: f}.Exec(ctx, ExecRequest{Path: "sleep", Args: []string{"30"}})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "pid 42") {
		t.Errorf("Exec(ctx ends) error %v; want ErrTimeout naming pid 42", err)
	}
	// The abandoned command is killed with its tree, not left running.
	execs := f.called("guest-exec")
	if len(execs) != 2 || !strings.HasSuffix(execs[1].args, `"sh","42"],"capture-output":true}`) {
		t.Errorf("guest-exec calls = %v; want the command then the kill-tree script for pid 42", execs)
	}
}

func TestFileRefused(t *testing.T) {
	tests := []struct {
		name string
		op   func(Agent) error
	}{
		{"read empty path", func(a Agent) error { _, _, err := a.FileRead(context.Background(), "", 0); return err }},
		{"read relative", func(a Agent) error { _, _, err := a.FileRead(context.Background(), "etc/passwd", 0); return err }},
		{"read NUL", func(a Agent) error { _, _, err := a.FileRead(context.Background(), "/etc/passwd\x00x", 0); return err }},
		{"read negative max", func(a Agent) error { _, _, err := a.FileRead(context.Background(), "/etc/passwd", -1); return err }},
		{"write relative", func(a Agent) error { return a.FileWrite(context.Background(), "x", nil, 0) }},
		{"write bad mode", func(a Agent) error { return a.FileWrite(context.Background(), "/tmp/x", nil, 0o10000) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCaller{reply: func(string, json.RawMessage) (any, error) { return 1, nil }}
			if err := tt.op(Agent{Caller: f}); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s: error %v; want ErrInvalidArgument", tt.name, err)
			}
			if len(f.calls) != 0 {
				t.Errorf("%s: made %d calls; want none", tt.name, len(f.calls))
			}
		})
	}
}

// TestFileCloseOnError: the handle is closed even when a read or write fails.
func TestFileCloseOnError(t *testing.T) {
	boom := &Error{Class: "GenericError", Desc: "io error"}
	f := &fakeCaller{reply: func(cmd string, _ json.RawMessage) (any, error) {
		switch cmd {
		case "guest-file-open":
			return 17, nil
		case "guest-file-close":
			return map[string]any{}, nil
		}
		return nil, boom
	}}
	a := Agent{Caller: f}
	if _, _, err := a.FileRead(context.Background(), "/x", 0); !errors.Is(err, boom) {
		t.Errorf("FileRead error %v; want the read error", err)
	}
	if err := a.FileWrite(context.Background(), "/x", []byte("data"), 0); !errors.Is(err, boom) {
		t.Errorf("FileWrite error %v; want the write error", err)
	}
	closes := f.called("guest-file-close")
	if len(closes) != 2 || closes[0].args != `{"handle":17}` {
		t.Errorf("guest-file-close calls = %v; want 2 with handle 17", closes)
	}
}

// TestFileChunkBytes: FileWrite and FileRead move at most ChunkBytes per
// command, FileChunkBytes when it is 0, and the data arrives whole.
func TestFileChunkBytes(t *testing.T) {
	data := []byte(strings.Repeat("0123456789", 100)) // 1000 bytes
	for _, tt := range []struct {
		chunk, want int
	}{{0, FileChunkBytes}, {-1, FileChunkBytes}, {64, 64}, {333, 333}} {
		ff := &fakeFile{}
		f := ff.caller()
		a := Agent{Caller: f, ChunkBytes: tt.chunk}
		if err := a.FileWrite(context.Background(), "/x", data, 0); err != nil || string(ff.data) != string(data) {
			t.Fatalf("FileWrite(ChunkBytes %d) = %v, stored %d bytes; want nil and the %d bytes", tt.chunk, err, len(ff.data), len(data))
		}
		got, truncated, err := a.FileRead(context.Background(), "/x", 1<<20)
		if err != nil || string(got) != string(data) || truncated {
			t.Errorf("FileRead(ChunkBytes %d) = %d bytes, %v, %v; want the %d bytes back", tt.chunk, len(got), truncated, err, len(data))
		}
		largest := 0
		for _, n := range ff.pieces {
			largest = max(largest, n)
		}
		if largest != tt.want {
			t.Errorf("largest file piece with ChunkBytes %d = %d; want %d", tt.chunk, largest, tt.want)
		}
	}
}
