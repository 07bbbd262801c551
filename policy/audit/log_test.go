package audit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func verifyFile(t *testing.T, path string) Report {
	t.Helper()
	key, err := LoadKey(DefaultKeyFile(path))
	if err != nil {
		t.Fatalf("LoadKey = %v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := Verify(f, key)
	if err != nil {
		t.Fatalf("Verify(%s) = %+v, %v; want a good chain", path, rep, err)
	}
	return rep
}

func TestReopenContinuesChain(t *testing.T) {
	path, _ := writeLog(t, 3)
	for _, mode := range []string{FsyncAlways, FsyncInterval} {
		l, err := Open(path, Options{Fsync: mode})
		if err != nil {
			t.Fatalf("Open(again, %s) = %v", mode, err)
		}
		if torn := l.Torn(); len(torn) != 0 {
			t.Errorf("Torn() = %v; want none", torn)
		}
		want := verifyFile(t, path).LastSeq + 1
		seq, err := l.Append(context.Background(), testRecord(1))
		if err != nil || seq != want {
			t.Fatalf("Append after reopen = %d, %v; want seq %d", seq, err, want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if rep := verifyFile(t, path); rep.Records != 5 || rep.LastSeq != 5 {
		t.Fatalf("Verify = %+v; want 5 records", rep)
	}
}

func TestTornLastLine(t *testing.T) {
	path, _ := writeLog(t, 4)
	data, _ := os.ReadFile(path)
	lines := readLines(t, path)
	// Cut the last record in the middle, as a crash during write(2) would.
	torn := data[:len(data)-len(lines[3])/2]
	if err := os.WriteFile(path, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open(torn) = %v; want it to recover", err)
	}
	got := l.Torn()
	if len(got) != 1 || got[0].Line != 4 || got[0].Seq != 4 || !got[0].Last {
		t.Fatalf("Torn() = %+v; want line 4 (seq 4), last", got)
	}
	seq, err := l.Append(context.Background(), testRecord(9))
	if err != nil || seq != 4 {
		t.Fatalf("Append after torn line = %d, %v; want seq 4 (the torn record was never acknowledged)", seq, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.HasPrefix(after, append(bytes.Clone(torn), '\n')) {
		t.Fatalf("log after reopen does not keep the torn bytes terminated by a newline")
	}
	rep := verifyFile(t, path)
	if rep.Records != 4 || rep.LastSeq != 4 || len(rep.Torn) != 1 || rep.Torn[0].Line != 4 || rep.Torn[0].Last {
		t.Fatalf("Verify = %+v; want 4 records and a torn line 4 in the middle", rep)
	}
	// Reopening again is clean: the torn line stays reported.
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("Open(again) = %v", err)
	}
	if got := l.Torn(); len(got) != 1 || got[0].Last {
		t.Errorf("Torn() = %+v; want the middle torn line", got)
	}
	l.Close()
}

func TestOpenRefusesTamperedLog(t *testing.T) {
	path, _ := writeLog(t, 4)
	data, _ := os.ReadFile(path)
	bad := bytes.Replace(data, []byte(`"grant":"alice"`), []byte(`"grant":"mallory"`), 1)
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(path, Options{}); !errors.Is(err, ErrTampered) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Open(tampered) = %v; want ErrTampered", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after, bad) {
		t.Errorf("Open(tampered) changed the file")
	}
}

func TestOpenBadInput(t *testing.T) {
	dir := t.TempDir()
	nonEmpty, _ := writeLog(t, 1)
	tests := []struct {
		name    string
		path    string
		opts    Options
		wantErr error
	}{
		{"unknown fsync mode", filepath.Join(dir, "a.jsonl"), Options{Fsync: "sometimes"}, ErrInvalid},
		{"negative interval", filepath.Join(dir, "b.jsonl"), Options{Interval: -time.Second}, ErrInvalid},
		{"missing key for a non-empty log", nonEmpty, Options{KeyFile: filepath.Join(dir, "none.key")}, os.ErrNotExist},
		{"log is a directory", dir, Options{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Open(tt.path, tt.opts)
			if err == nil {
				l.Close()
				t.Fatalf("Open(%q, %+v) = nil error; want one", tt.path, tt.opts)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Open(%q, %+v) = %v; want %v", tt.path, tt.opts, err, tt.wantErr)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "none.key")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open created a new key for a log that has records: %v", err)
	}
}

func TestOpenIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l2, err := Open(path, Options{})
	if err == nil {
		l2.Close()
		t.Fatalf("second Open of the same log = nil error; want in use")
	}
	if !errors.Is(err, ErrInUse) {
		t.Errorf("second Open of the same log = %v; want ErrInUse (vmgate serve adds what to do)", err)
	}
}

func TestAppendBadRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ok := testRecord(1)
	mod := func(f func(*Record)) Record { r := ok; f(&r); return r }
	tests := []struct {
		name string
		rec  Record
		want error
	}{
		{"unknown kind", mod(func(r *Record) { r.Kind = "maybe" }), ErrInvalid},
		{"no kind", mod(func(r *Record) { r.Kind = "" }), ErrInvalid},
		{"no call id", mod(func(r *Record) { r.CallID = "" }), ErrInvalid},
		{"decision without decision", mod(func(r *Record) { r.Decision = "" }), ErrInvalid},
		{"outcome without outcome", mod(func(r *Record) { r.Kind = KindOutcome; r.Counters = nil }), ErrInvalid},
		{"outcome with counters", mod(func(r *Record) { r.Kind = KindOutcome; r.Outcome = "ok" }), ErrInvalid},
		{"decision refunded", mod(func(r *Record) { r.Refunded = true }), ErrInvalid},
		{"seq set by caller", mod(func(r *Record) { r.Seq = 7 }), ErrInvalid},
		{"prev_hash set by caller", mod(func(r *Record) { r.PrevHash = "00" }), ErrInvalid},
		{"hash set by caller", mod(func(r *Record) { r.Hash = "00" }), ErrInvalid},
		{"negative duration", mod(func(r *Record) { r.DurationMS = -1 }), ErrInvalid},
		{"counter without key", mod(func(r *Record) { r.Counters = Counters{{Window: time.Millisecond, Max: 1}} }), ErrInvalid},
		{"counter zero window", mod(func(r *Record) { r.Counters = Counters{{Key: "k", Max: 1}} }), ErrInvalid},
		{"counter window under a millisecond", mod(func(r *Record) { r.Counters = Counters{{Key: "k", Window: time.Microsecond, Max: 1}} }), ErrInvalid},
		{"unencodable argument", mod(func(r *Record) { r.Args = map[string]any{"x": make(chan int)} }), ErrInvalid},
		{"too large", mod(func(r *Record) { r.Args = map[string]any{"command": strings.Repeat("x", MaxRecordBytes)} }), ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if seq, err := l.Append(context.Background(), tt.rec); !errors.Is(err, tt.want) {
				t.Fatalf("Append(%s) = %d, %v; want %v", tt.name, seq, err, tt.want)
			}
			if err := l.AppendLazy(context.Background(), tt.rec); !errors.Is(err, tt.want) {
				t.Fatalf("AppendLazy(%s) = %v; want %v", tt.name, err, tt.want)
			}
		})
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("log has %d bytes after only bad appends; want 0", fi.Size())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Append(ctx, ok); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append(cancelled ctx) = %v; want context.Canceled", err)
	}
}

func TestAppendAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close() = %v; want nil", err)
	}
	if _, err := l.Append(context.Background(), testRecord(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v; want ErrClosed", err)
	}
	if err := l.AppendLazy(context.Background(), testRecord(2)); !errors.Is(err, ErrClosed) {
		t.Fatalf("AppendLazy after Close = %v; want ErrClosed", err)
	}
}

func TestLazyOutcomeIsWritten(t *testing.T) {
	for _, mode := range []string{FsyncAlways, FsyncInterval} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			l, err := Open(path, Options{Fsync: mode})
			if err != nil {
				t.Fatal(err)
			}
			out := testRecord(2)
			out.Refunded = true
			if err := l.AppendLazy(context.Background(), out); err != nil {
				t.Fatalf("AppendLazy = %v", err)
			}
			// A later decision goes out after it: the lazy record is in the
			// file once the decision is acknowledged.
			seq, err := l.Append(context.Background(), testRecord(3))
			if err != nil || seq != 2 {
				t.Fatalf("Append = %d, %v; want seq 2", seq, err)
			}
			var recs []Record
			if err := Read(path, func(r Record) error { recs = append(recs, r); return nil }); err != nil {
				t.Fatal(err)
			}
			if len(recs) != 2 || recs[0].Kind != KindOutcome || !recs[0].Refunded || recs[1].Kind != KindDecision {
				t.Fatalf("Read = %+v; want the refunded outcome then the decision", recs)
			}
			// A lazy record alone is flushed by Close.
			if err := l.AppendLazy(context.Background(), testRecord(4)); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if rep := verifyFile(t, path); rep.Records != 3 {
				t.Fatalf("Verify after Close = %+v; want 3 records", rep)
			}
		})
	}
}

func TestConcurrentWriters(t *testing.T) {
	const writers, each = 64, 20
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[uint64]bool{}
		wg   sync.WaitGroup
		errs = make(chan error, writers)
	)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				rec := testRecord(1)
				rec.CallID = fmt.Sprintf("w%d-%d", w, i)
				seq, err := l.Append(context.Background(), rec)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if seen[seq] {
					errs <- fmt.Errorf("seq %d returned twice", seq)
				}
				seen[seq] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for s := uint64(1); s <= writers*each; s++ {
		if !seen[s] {
			t.Fatalf("seq %d was never returned; want gapless 1..%d", s, writers*each)
		}
	}
	if rep := verifyFile(t, path); rep.Records != writers*each || rep.LastSeq != writers*each {
		t.Fatalf("Verify = %+v; want %d records", rep, writers*each)
	}
}

func TestRedactedInFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{"stdin-secret-7f3a", "env-secret-91bc", "file-secret-c0de", "b64-secret-55aa", "upper-secret-1234", "typed-secret-4e2d"}
	rec := testRecord(1)
	rec.Args = map[string]any{
		"vm": "lab/vm1", "stdin": secrets[0], "env": map[string]any{"TOKEN": secrets[1]},
		"content": secrets[2], "content_base64": secrets[3], "STDIN": secrets[4], "text": secrets[5],
	}
	if _, err := l.Append(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for _, s := range secrets {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("log contains secret %q: %s", s, raw)
		}
	}
	if !bytes.Contains(raw, []byte(`"TOKEN":"sha256:`)) || !bytes.Contains(raw, []byte(`"vm":"lab/vm1"`)) {
		t.Errorf("log = %s; want env names and plain arguments kept", raw)
	}
	if rec.Args["stdin"] != secrets[0] {
		t.Errorf("Append changed the caller's arguments: %v", rec.Args)
	}
}

// TestDiskFull runs the log on a 64 KiB tmpfs: when the disk fills, Append
// fails and nothing half-written stays; once space is freed appends work
// again and the chain verifies.
func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (needs root / CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Most of the space goes to a filler file.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 40<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var last uint64
	var appendErr error
	for i := 0; i < 10000; i++ {
		rec := testRecord(1)
		rec.Reason = strings.Repeat("r", 300)
		seq, err := l.Append(ctx, rec)
		if err != nil {
			appendErr = err
			break
		}
		last = seq
	}
	if appendErr == nil || !errors.Is(appendErr, syscall.ENOSPC) {
		t.Fatalf("Append on a full disk = %v; want ENOSPC", appendErr)
	}
	if last == 0 {
		t.Fatalf("no append succeeded before the disk was full")
	}
	// Nothing half-written: the file is exactly the acknowledged records.
	l.Close()
	rep := verifyFile(t, path)
	if rep.LastSeq != last || len(rep.Torn) != 0 {
		t.Fatalf("Verify after ENOSPC = %+v; want exactly %d records and no torn line", rep, last)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Also without reopening: the same log keeps working after space is freed.
	if err := os.WriteFile(filler, make([]byte, 60<<10), 0o600); err == nil {
		t.Fatalf("filler fit again; the test needs a full disk")
	}
	if _, err := l.Append(ctx, testRecord(1)); err == nil {
		t.Fatalf("Append on a full disk = nil error")
	}
	os.Remove(filler)
	seq, err := l.Append(ctx, testRecord(1))
	if err != nil || seq != last+1 {
		t.Fatalf("Append after freeing space = %d, %v; want seq %d", seq, err, last+1)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := verifyFile(t, path); rep.LastSeq != last+1 {
		t.Fatalf("Verify = %+v; want last seq %d", rep, last+1)
	}
}

const killChildEnv = "VMGATE_AUDIT_KILL_CHILD"

// killChild is the body of TestKill9's child process (run from TestMain
// when killChildEnv is set): it appends decision and outcome records from 4
// goroutines until killed and writes each acknowledged seq to file
// descriptor 3. It returns only on an error.
func killChild(path string) error {
	l, err := Open(path, Options{})
	if err != nil {
		return err
	}
	out := os.NewFile(3, "acks")
	var mu sync.Mutex
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() {
			for i := 0; ; i++ {
				rec := testRecord(1)
				rec.CallID = fmt.Sprintf("w%d-%d", w, i)
				seq, err := l.Append(context.Background(), rec)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				fmt.Fprintln(out, seq)
				mu.Unlock()
				done := testRecord(2)
				done.CallID = rec.CallID
				if err := l.AppendLazy(context.Background(), done); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	return <-errs
}

// TestKill9 SIGKILLs a child appending in a loop (three times, reopening the
// same log): every seq it acknowledged is in the file, and the chain verifies
// with at most torn lines.
func TestKill9(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	acked := map[uint64]bool{}
	for round := 0; round < 3; round++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), killChildEnv+"="+path)
		cmd.ExtraFiles = []*os.File{w}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		sc := bufio.NewScanner(r)
		n := 0
		for sc.Scan() {
			s, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("child wrote %q", sc.Text())
			}
			acked[s] = true
			if n++; n == 150 {
				// Kill by pid while it is mid-stream.
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		werr := cmd.Wait()
		r.Close()
		if n < 150 {
			t.Fatalf("round %d: child acknowledged only %d appends before exiting (%v)", round, n, werr)
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v; want killed by SIGKILL", round, werr)
		}
		key, err := LoadKey(DefaultKeyFile(path))
		if err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(path)
		rep, err := Verify(f, key)
		f.Close()
		if err != nil {
			t.Fatalf("round %d: Verify after kill -9 = %+v, %v; want good (torn lines allowed)", round, rep, err)
		}
		for _, tl := range rep.Torn {
			t.Logf("round %d: torn line %d (last: %v)", round, tl.Line, tl.Last)
		}
	}
	inFile := map[uint64]bool{}
	if err := Read(path, func(r Record) error { inFile[r.Seq] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	for s := range acked {
		if !inFile[s] {
			t.Errorf("acknowledged seq %d is not in the log", s)
		}
	}
	// And the log opens for appending once more.
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after kill -9 = %v", err)
	}
	if _, err := l.Append(context.Background(), testRecord(1)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	verifyFile(t, path)
}
