package hypervisor_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// privateDir is a directory like the one go-plugin makes for a plugin's
// sockets: os.MkdirTemp, mode 0700.
func privateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(t.TempDir(), "plugin-dir")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// serveCalls serves d on a call socket in a fresh private directory and
// returns the host-side driver for it and the directory.
func serveCalls(t *testing.T, d hypervisor.Driver) (hypervisor.Driver, string, func() error) {
	t.Helper()
	dir := privateDir(t)
	stop, err := hypervisor.ServeCallSocket(dir, d, os.Geteuid())
	if err != nil {
		t.Fatalf("ServeCallSocket = %v", err)
	}
	t.Cleanup(func() { stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, closeHost, err := hypervisor.DialCallSocket(ctx, "fake", dir)
	if err != nil {
		t.Fatalf("DialCallSocket = %v", err)
	}
	t.Cleanup(func() { closeHost() })
	return host, dir, stop
}

func TestCallSocketCarriesEveryMethod(t *testing.T) {
	started := time.Unix(1700000000, 0).UTC()
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB: larger than any buffer
	var wrote []byte
	fake := &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning, Info: "i", Agent: true}}, nil
		},
		StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
			return hypervisor.Status{Name: vm, State: hypervisor.StateStopped, Detail: "d"}, nil
		},
		ExecStartFunc: func(_ context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			return hypervisor.ExecHandle{PID: int64(len(req.Argv)), Token: vm + ":" + strings.Join(req.Argv, " "), StartedAt: started}, nil
		},
		FileReadFunc: func(_ context.Context, _, path string, maxBytes int64) (hypervisor.FileContent, error) {
			return hypervisor.FileContent{Data: big[:maxBytes], Truncated: path == "/cut"}, nil
		},
		FileWriteFunc: func(_ context.Context, _, _ string, data []byte, _ uint32) error {
			wrote = data
			return nil
		},
	}
	host, _, _ := serveCalls(t, fake)
	ctx := context.Background()
	vms, err := host.ListVMs(ctx)
	if want := []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning, Info: "i", Agent: true}}; err != nil || !reflect.DeepEqual(vms, want) {
		t.Errorf("ListVMs() = %+v, %v; want %+v", vms, err, want)
	}
	st, err := host.Status(ctx, "vm2")
	if want := (hypervisor.Status{Name: "vm2", State: hypervisor.StateStopped, Detail: "d"}); err != nil || st != want {
		t.Errorf("Status(vm2) = %+v, %v; want %+v", st, err, want)
	}
	h, err := host.ExecStart(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"a", "b"}})
	if err != nil || h.PID != 2 || h.Token != "vm1:a b" || !h.StartedAt.Equal(started) {
		t.Errorf("ExecStart() = %+v, %v; want pid 2, token \"vm1:a b\", started %v", h, err, started)
	}
	fc, err := host.FileRead(ctx, "vm1", "/cut", int64(len(big)))
	if err != nil || !bytes.Equal(fc.Data, big) || !fc.Truncated {
		t.Errorf("FileRead(32 MiB) = %d bytes, truncated %v, %v; want the 32 MiB, truncated", len(fc.Data), fc.Truncated, err)
	}
	if err := host.FileWrite(ctx, "vm1", "/f", big, 0o644); err != nil || !bytes.Equal(wrote, big) {
		t.Errorf("FileWrite(32 MiB) = %v, %d bytes arrived; want nil, all", err, len(wrote))
	}
	// Unset fields fail with ErrNotSupported on the plugin side: it crosses.
	if _, err := host.AgentInfo(ctx, "vm1"); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("AgentInfo() on a fake without it = %v; want ErrNotSupported", err)
	}
}

func TestCallSocketErrorsKeepTheirKinds(t *testing.T) {
	tests := []struct {
		name string
		err  error
		is   []error
	}{
		{"unknown VM", fmt.Errorf("qemu: status: %w: vm9", hypervisor.ErrUnknownVM), []error{hypervisor.ErrUnknownVM}},
		{"command disabled", fmt.Errorf("qemu: exec: %w", &hypervisor.CommandDisabledError{Command: "guest-exec"}), []error{hypervisor.ErrCommandDisabled}},
		{"timeout", fmt.Errorf("qemu: exec: %w: %w", hypervisor.ErrTimeout, context.DeadlineExceeded), []error{hypervisor.ErrTimeout, context.DeadlineExceeded}},
		{"plain", errors.New("qemu: something odd"), nil},
	}
	var mu sync.Mutex
	var next error
	host, _, _ := serveCalls(t, &hypervisortest.Fake{StatusFunc: func(context.Context, string) (hypervisor.Status, error) {
		mu.Lock()
		defer mu.Unlock()
		return hypervisor.Status{}, next
	}})
	for _, tt := range tests {
		mu.Lock()
		next = tt.err
		mu.Unlock()
		_, err := host.Status(context.Background(), "vm1")
		if err == nil || err.Error() != tt.err.Error() {
			t.Errorf("%s: Status() = %v; want %q", tt.name, err, tt.err)
			continue
		}
		for _, s := range tt.is {
			if !errors.Is(err, s) {
				t.Errorf("%s: errors.Is(%v, %v) = false; want true", tt.name, err, s)
			}
		}
		var cd *hypervisor.CommandDisabledError
		if errors.As(tt.err, &cd) {
			var got *hypervisor.CommandDisabledError
			if !errors.As(err, &got) || got.Command != "guest-exec" {
				t.Errorf("%s: CommandDisabledError = %+v; want command guest-exec", tt.name, got)
			}
		}
		if errors.Is(err, hypervisor.ErrPluginExited) {
			t.Errorf("%s: %v matches ErrPluginExited; want a driver error only", tt.name, err)
		}
	}
}

// TestCallSocketCancel: the host's context ending cancels the call in the
// plugin, the host gets its context's error, and the next call works.
func TestCallSocketCancel(t *testing.T) {
	entered := make(chan struct{}, 1)
	seen := make(chan error, 1)
	var deadline bool
	host, _, _ := serveCalls(t, &hypervisortest.Fake{
		StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
			if vm == "quick" {
				_, deadline = ctx.Deadline()
				return hypervisor.Status{Name: vm}, nil
			}
			entered <- struct{}{}
			<-ctx.Done()
			seen <- ctx.Err()
			return hypervisor.Status{}, ctx.Err()
		},
	})
	for _, tt := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		cancel  bool
		wantErr error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, true, context.Canceled},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 5*hypervisor.WatchAfter+50*time.Millisecond)
		}, false, context.DeadlineExceeded},
	} {
		ctx, cancel := tt.ctx()
		errc := make(chan error, 1)
		go func() {
			_, err := host.Status(ctx, "slow")
			errc <- err
		}()
		<-entered
		if tt.cancel {
			// Past watchAfter the plugin watches the connection.
			time.Sleep(2 * hypervisor.WatchAfter)
			cancel()
		}
		select {
		case err := <-seen:
			if err == nil {
				t.Errorf("%s: the plugin's context ended without an error", tt.name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the plugin's call was not cancelled within 10s", tt.name)
		}
		if err := <-errc; !errors.Is(err, tt.wantErr) || errors.Is(err, hypervisor.ErrPluginExited) {
			t.Errorf("%s: Status() = %v; want %v, not ErrPluginExited", tt.name, err, tt.wantErr)
		}
		cancel()
		qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if st, err := host.Status(qctx, "quick"); err != nil || st.Name != "quick" || !deadline {
			t.Errorf("%s: Status(quick) after = %+v, %v, deadline %v; want it answered, with the deadline carried", tt.name, st, err, deadline)
		}
		qcancel()
	}
}

// TestCallSocketConcurrentCalls: every call in flight has a connection of
// its own, so calls that wait for each other all complete.
func TestCallSocketConcurrentCalls(t *testing.T) {
	const n = 3 * hypervisor.CallSocketIdle
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	host, _, _ := serveCalls(t, &hypervisortest.Fake{StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
		arrived.Done()
		select {
		case <-all:
			return hypervisor.Status{Name: vm}, nil
		case <-ctx.Done():
			return hypervisor.Status{}, ctx.Err()
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vm := fmt.Sprintf("vm%d", i)
			st, err := host.Status(ctx, vm)
			if err == nil && st.Name != vm {
				err = fmt.Errorf("answer for %q", st.Name)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Errorf("%d concurrent Status() = %v; want all answered", n, err)
	}
}

// TestCallSocketPluginGone: a call in flight when the plugin side goes away
// fails as the plugin having exited, and so do later calls.
func TestCallSocketPluginGone(t *testing.T) {
	entered := make(chan struct{})
	host, _, stop := serveCalls(t, &hypervisortest.Fake{StatusFunc: func(ctx context.Context, _ string) (hypervisor.Status, error) {
		close(entered)
		<-ctx.Done()
		return hypervisor.Status{}, ctx.Err()
	}})
	errc := make(chan error, 1)
	go func() {
		_, err := host.Status(context.Background(), "vm1")
		errc <- err
	}()
	<-entered
	time.Sleep(2 * hypervisor.WatchAfter) // past watchAfter: the plugin watches the connection
	if err := stop(); err != nil {
		t.Errorf("stop = %v", err)
	}
	for i, err := range []error{<-errc, func() error { _, err := host.Status(context.Background(), "vm1"); return err }()} {
		var ee *hypervisor.ExitedError
		if !errors.As(err, &ee) || ee.Driver != "fake" {
			t.Errorf("call %d with the plugin side gone = %v; want ExitedError naming the driver", i, err)
		}
	}
}

func TestCallSocketRefusesAnotherUser(t *testing.T) {
	dir := privateDir(t)
	stop, err := hypervisor.ServeCallSocket(dir, &hypervisortest.Fake{}, os.Geteuid()+1)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := hypervisor.DialCallSocket(ctx, "fake", dir); err == nil || !strings.Contains(err.Error(), "hello") {
		t.Errorf("DialCallSocket to a plugin expecting another uid = %v; want the hello refused", err)
	}
}

func TestCallSocketNeedsAPrivateDirectory(t *testing.T) {
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	private := privateDir(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(private, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{open, link, file, filepath.Join(private, "missing")} {
		if stop, err := hypervisor.ServeCallSocket(dir, &hypervisortest.Fake{}, os.Geteuid()); err == nil {
			stop()
			t.Errorf("ServeCallSocket(%s) = nil error; want refused", dir)
		}
		if _, _, err := hypervisor.DialCallSocket(context.Background(), "fake", dir); err == nil {
			t.Errorf("DialCallSocket(%s) = nil error; want refused", dir)
		}
	}
	// A private directory without a call socket: a plugin that offers none.
	if _, _, err := hypervisor.DialCallSocket(context.Background(), "fake", private); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DialCallSocket(no socket) = %v; want fs.ErrNotExist (the host stays on gRPC)", err)
	}
	_, dir, _ := serveCalls(t, &hypervisortest.Fake{})
	fi, err := os.Stat(filepath.Join(dir, hypervisor.CallSocketName))
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("call socket = %v, %v; want a socket with mode 0600", fi.Mode(), err)
	}
}

func TestCallSocketUnknownMethodAndOversizedMessage(t *testing.T) {
	host, dir, _ := serveCalls(t, &hypervisortest.Fake{FileWriteFunc: func(context.Context, string, string, []byte, uint32) error { return nil }})
	ctx := context.Background()
	err := hypervisor.CallSocketInvoke(ctx, dir, "/vmgate.hypervisor.v1.Driver/Nope", &pb.VMRequest{}, &pb.StatusResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Invoke(unknown method) = %v; want Unimplemented", err)
	}
	huge := make([]byte, hypervisor.MaxMessageBytes+1)
	if err := host.FileWrite(ctx, "vm1", "/f", huge, 0o644); err == nil || errors.Is(err, hypervisor.ErrPluginExited) {
		t.Errorf("FileWrite(MaxMessageBytes+1) = %v; want an error, not ErrPluginExited", err)
	}
	if err := host.FileWrite(ctx, "vm1", "/f", []byte("ok"), 0o644); err != nil {
		t.Errorf("FileWrite(small) after the refused one = %v; want nil", err)
	}
}

// rawConn connects to the call socket in dir and exchanges the hello.
func rawConn(t *testing.T, dir string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", filepath.Join(dir, hypervisor.CallSocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if _, err := io.WriteString(c, "vmgate-driver-calls/1\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil || line != "vmgate-driver-calls/1\n" {
		t.Fatalf("hello = %q, %v", line, err)
	}
	return c, r
}

// TestCallSocketHostileFrames: whatever a peer sends, the plugin side closes
// that connection (without answering or crashing) and keeps serving others.
func TestCallSocketHostileFrames(t *testing.T) {
	calls := 0
	var mu sync.Mutex
	host, dir, _ := serveCalls(t, &hypervisortest.Fake{StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return hypervisor.Status{Name: vm}, nil
	}})
	frame := func(typ byte, body []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(1+len(body)))
		return append(append(b, typ), body...)
	}
	method := "/vmgate.hypervisor.v1.Driver/Status"
	callBody := append(append([]byte{byte(len(method))}, method...), make([]byte, 8)...)
	tests := []struct {
		name string
		send []byte
	}{
		{"zero length", []byte{0, 0, 0, 0}},
		{"length over the limit", binary.BigEndian.AppendUint32(nil, hypervisor.MaxMessageBytes+1<<20)},
		{"a reply frame", frame(2, nil)},
		{"a call frame cut short", frame(1, []byte{200, 'x'})},
		{"truncated stream", frame(1, callBody)[:10]},
		{"undecodable request", frame(1, append(append([]byte(nil), callBody...), 0xff, 0xff, 0xff))},
	}
	for _, tt := range tests {
		c, r := rawConn(t, dir)
		if _, err := c.Write(tt.send); err != nil {
			t.Fatalf("%s: write = %v", tt.name, err)
		}
		c.(*net.UnixConn).CloseWrite()
		rest, err := io.ReadAll(r)
		switch {
		case tt.name == "undecodable request":
			// A well-framed call with a bad message gets an error answer.
			if err != nil || len(rest) < 5 || rest[4] != 3 {
				t.Errorf("%s: answer %q, %v; want a status frame", tt.name, rest, err)
			}
		case err != nil || len(rest) != 0:
			t.Errorf("%s: the plugin answered %q, %v; want the connection closed without an answer", tt.name, rest, err)
		}
	}
	mu.Lock()
	n := calls
	mu.Unlock()
	if n != 0 {
		t.Errorf("hostile frames reached the driver %d times; want 0", n)
	}
	if st, err := host.Status(context.Background(), "vm1"); err != nil || st.Name != "vm1" {
		t.Errorf("Status() after hostile peers = %+v, %v; want served", st, err)
	}
}
