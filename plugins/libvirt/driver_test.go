package libvirt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// fakeConn is a conn made of function fields; a nil field fails the call.
type fakeConn struct {
	lookup       func(name string) (golibvirt.Domain, error)
	agent        func(dom golibvirt.Domain, cmd string, timeout int32) (golibvirt.OptString, error)
	state        func(dom golibvirt.Domain) (int32, error)
	gone         chan struct{}
	disconnected atomic.Int32
}

var errUnset = errors.New("fake: not set")

func newFake() *fakeConn {
	return &fakeConn{
		gone: make(chan struct{}),
		lookup: func(name string) (golibvirt.Domain, error) {
			return golibvirt.Domain{Name: name, UUID: golibvirt.UUID{1}}, nil
		},
	}
}

func (f *fakeConn) ConnectListAllDomains(int32, golibvirt.ConnectListAllDomainsFlags) ([]golibvirt.Domain, uint32, error) {
	return nil, 0, errUnset
}
func (f *fakeConn) DomainLookupByName(name string) (golibvirt.Domain, error) { return f.lookup(name) }
func (f *fakeConn) DomainGetState(dom golibvirt.Domain, _ uint32) (int32, int32, error) {
	if f.state == nil {
		return 0, 0, errUnset
	}
	s, err := f.state(dom)
	return s, 0, err
}
func (f *fakeConn) DomainGetMetadata(golibvirt.Domain, int32, golibvirt.OptString, golibvirt.DomainModificationImpact) (string, error) {
	return "", errUnset
}
func (f *fakeConn) DomainGetXMLDesc(golibvirt.Domain, golibvirt.DomainXMLFlags) (string, error) {
	return "", errUnset
}
func (f *fakeConn) DomainIsPersistent(golibvirt.Domain) (int32, error) { return 0, errUnset }
func (f *fakeConn) QEMUDomainAgentCommand(dom golibvirt.Domain, cmd string, timeout int32, _ uint32) (golibvirt.OptString, error) {
	if f.agent == nil {
		return nil, errUnset
	}
	return f.agent(dom, cmd, timeout)
}
func (f *fakeConn) DomainShutdownFlags(golibvirt.Domain, golibvirt.DomainShutdownFlagValues) error {
	return errUnset
}
func (f *fakeConn) DomainReboot(golibvirt.Domain, golibvirt.DomainRebootFlagValues) error {
	return errUnset
}
func (f *fakeConn) DomainReset(golibvirt.Domain, uint32) error { return errUnset }
func (f *fakeConn) DomainDestroy(golibvirt.Domain) error       { return errUnset }
func (f *fakeConn) DomainCreate(golibvirt.Domain) error        { return errUnset }
func (f *fakeConn) Disconnected() <-chan struct{}              { return f.gone }
func (f *fakeConn) Disconnect() error {
	f.disconnected.Add(1)
	return nil
}

// fakeDriver returns a Driver whose every dial returns the next of conns
// (the last one repeatedly), and a counter of dials.
func fakeDriver(t *testing.T, conns ...*fakeConn) (*Driver, *atomic.Int32) {
	t.Helper()
	d, err := New(Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	var dials atomic.Int32
	d.dial = func() (conn, error) {
		n := int(dials.Add(1)) - 1
		return conns[min(n, len(conns)-1)], nil
	}
	t.Cleanup(func() { d.Close() })
	return d, &dials
}

func TestParseURI(t *testing.T) {
	tests := []struct {
		uri     string
		network string
		address string
		name    string
		err     error
	}{
		{"", "unix", DefaultSocket, "qemu:///system", nil},
		{"qemu:///system", "unix", DefaultSocket, "qemu:///system", nil},
		{"qemu+unix:///system", "unix", DefaultSocket, "qemu:///system", nil},
		{"qemu:///system?socket=/run/x/sock", "unix", "/run/x/sock", "qemu:///system", nil},
		{"qemu:///session?socket=/run/user/1000/libvirt/libvirt-sock", "unix", "/run/user/1000/libvirt/libvirt-sock", "qemu:///session", nil},
		{"qemu+tcp://host.example/system", "tcp", "host.example:16509", "qemu:///system", nil},
		{"qemu+tcp://10.0.0.1:1234/system", "tcp", "10.0.0.1:1234", "qemu:///system", nil},
		{"qemu+tcp://[::1]:1234/system", "tcp", "[::1]:1234", "qemu:///system", nil},
		{"qemu+ssh://root@host/system", "", "", "", hypervisor.ErrNotSupported},
		{"qemu+ssh://host/system", "", "", "", hypervisor.ErrNotSupported},
		{"qemu+tls://host/system", "", "", "", hypervisor.ErrNotSupported},
		{"qemu+libssh2://host/system", "", "", "", hypervisor.ErrNotSupported},
		{"xen:///system", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///embed?root=/tmp/x", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///session", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///system?socket=relative/sock", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///system?socket=/a&socket=/b", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///system?no_verify=1", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu://host/system", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu+tcp:///system", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu+tcp://host/system?socket=/x", "", "", "", hypervisor.ErrInvalidArgument},
		{"qemu:///system#frag", "", "", "", hypervisor.ErrInvalidArgument},
		{"::::", "", "", "", hypervisor.ErrInvalidArgument},
	}
	for _, tc := range tests {
		ep, err := parseURI(tc.uri)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("parseURI(%q) = %+v, %v; want error %v", tc.uri, ep, err, tc.err)
			}
			continue
		}
		want := endpoint{network: tc.network, address: tc.address, name: tc.name}
		if err != nil || ep != want {
			t.Errorf("parseURI(%q) = %+v, %v; want %+v", tc.uri, ep, err, want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"bad glob", Config{NameGlob: "[a-"}},
		{"metadata uri with quote", Config{MetadataURI: `urn:a"b`}},
		{"metadata uri not absolute", Config{MetadataURI: "vmgate"}},
		{"negative exec timeout", Config{ExecTimeout: -1}},
		{"negative info ttl", Config{InfoTTL: -time.Second}},
		{"negative dial timeout", Config{DialTimeout: -time.Second}},
		{"ssh uri", Config{URI: "qemu+ssh://h/system"}},
	}
	for _, tc := range tests {
		if d, err := New(tc.cfg); err == nil {
			d.Close()
			t.Errorf("New(%s: %+v) = nil error; want an error", tc.name, tc.cfg)
		}
	}
}

func TestAgentTimeout(t *testing.T) {
	now := time.Now()
	tests := []struct {
		left time.Duration
		want int32
	}{
		{-time.Second, 1},
		{0, 1},
		{100 * time.Millisecond, 1},
		{time.Second, 1},
		{1001 * time.Millisecond, 2},
		{30 * time.Second, 30},
	}
	for _, tc := range tests {
		ctx, cancel := context.WithDeadline(context.Background(), now.Add(tc.left))
		if got := agentTimeout(ctx, now); got != tc.want {
			t.Errorf("agentTimeout(deadline in %v) = %d; want %d", tc.left, got, tc.want)
		}
		cancel()
	}
	if got := agentTimeout(context.Background(), now); got != int32(DefaultAgentTimeout/time.Second) {
		t.Errorf("agentTimeout(no deadline) = %d; want %d", got, DefaultAgentTimeout/time.Second)
	}
}

// TestAgentErrors: libvirt's errors for agent commands become what the
// driver's callers branch on.
func TestAgentErrors(t *testing.T) {
	lverr := func(code golibvirt.ErrorNumber, msg string) error {
		return golibvirt.Error{Code: uint32(code), Message: msg}
	}
	tests := []struct {
		name  string
		err   error
		check func(err error) bool
		want  string
	}{
		{"disabled", lverr(golibvirt.ErrInternalError, "internal error: unable to execute QEMU agent command 'guest-info': Command guest-info has been disabled"),
			func(err error) bool {
				var c *hypervisor.CommandDisabledError
				return errors.As(err, &c) && c.Command == "guest-info"
			}, "CommandDisabledError{guest-info}"},
		{"not found", lverr(golibvirt.ErrInternalError, "internal error: unable to execute QEMU agent command 'guest-info': The command guest-info has not been found"),
			func(err error) bool { return errors.Is(err, hypervisor.ErrCommandDisabled) }, "ErrCommandDisabled"},
		{"generic error reply", lverr(golibvirt.ErrInternalError, "internal error: unable to execute QEMU agent command 'guest-info': failed to open file '/x': No such file or directory"),
			func(err error) bool {
				var e *qga.Error
				return errors.As(err, &e) && e.Class == "GenericError" && strings.Contains(e.Desc, "No such file") &&
					errors.Is(err, hypervisor.ErrBackend) && strings.Contains(err.Error(), "backend error: the guest agent answered: failed to open file '/x': No such file or directory")
			}, "*qga.Error GenericError as ErrBackend with the agent's desc"},
		{"agent not connected", lverr(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected"),
			func(err error) bool { return errors.Is(err, hypervisor.ErrAgentUnavailable) }, "ErrAgentUnavailable"},
		{"not running", lverr(golibvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running"),
			func(err error) bool {
				return errors.Is(err, hypervisor.ErrAgentUnavailable) && errors.Is(err, hypervisor.ErrVMNotRunning)
			}, "ErrAgentUnavailable and ErrVMNotRunning"},
		{"no channel", lverr(golibvirt.ErrArgumentUnsupported, "argument unsupported: QEMU guest agent is not configured"),
			func(err error) bool { return errors.Is(err, hypervisor.ErrAgentUnavailable) }, "ErrAgentUnavailable"},
		{"domain gone", lverr(golibvirt.ErrNoDomain, "Domain not found"),
			func(err error) bool { return errors.Is(err, hypervisor.ErrUnknownVM) }, "ErrUnknownVM"},
		{"other libvirt error", lverr(golibvirt.ErrSystemError, "some failure"),
			func(err error) bool {
				return err != nil && !errors.Is(err, hypervisor.ErrTimeout) && !errors.Is(err, hypervisor.ErrAgentUnavailable)
			}, "a plain error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.agent = func(golibvirt.Domain, string, int32) (golibvirt.OptString, error) { return nil, tc.err }
			d, _ := fakeDriver(t, f)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := d.AgentInfo(ctx, "vm1")
			if !tc.check(err) {
				t.Errorf("AgentInfo() with libvirt error %q = %v; want %s", tc.err, err, tc.want)
			}
		})
	}
}

// TestAgentReplies: the raw reply libvirt returns is decoded by qga, and the
// timeout given to libvirt follows the caller's deadline.
func TestAgentReplies(t *testing.T) {
	f := newFake()
	var gotTimeout atomic.Int32
	f.agent = func(_ golibvirt.Domain, cmd string, timeout int32) (golibvirt.OptString, error) {
		gotTimeout.Store(timeout)
		if !strings.Contains(cmd, `"execute":"guest-info"`) {
			return nil, errors.New("unexpected command " + cmd)
		}
		return golibvirt.OptString{`{"return":{"version":"7.2.22","supported_commands":[{"enabled":true,"name":"guest-exec"},{"enabled":false,"name":"guest-file-open"}]}}`}, nil
	}
	d, _ := fakeDriver(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
	defer cancel()
	info, err := d.AgentInfo(ctx, "vm1")
	if err != nil || info.Version != "7.2.22" || !info.Enabled("guest-exec") || info.Enabled("guest-file-open") {
		t.Errorf("AgentInfo() = %+v, %v; want version 7.2.22, guest-exec enabled, guest-file-open disabled", info, err)
	}
	if got := gotTimeout.Load(); got < 6 || got > 7 {
		t.Errorf("timeout given to libvirt with 7 s left = %d; want 6 or 7", got)
	}
}

// TestHungAgentIsolated: a domain whose agent call never returns times out
// within the caller's deadline, a second call to it waits for its own
// deadline only, and another domain answers meanwhile.
func TestHungAgentIsolated(t *testing.T) {
	release := make(chan struct{})
	f := newFake()
	f.agent = func(dom golibvirt.Domain, cmd string, _ int32) (golibvirt.OptString, error) {
		if dom.Name == "hung" {
			<-release
		}
		return golibvirt.OptString{`{"return":{}}`}, nil
	}
	d, _ := fakeDriver(t, f)
	t.Cleanup(func() { close(release) })

	const deadline = 300 * time.Millisecond
	errs := make(chan error, 2)
	start := time.Now()
	for range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			errs <- agentCaller{d: d, dom: mustLookup(t, d, "hung")}.Call(ctx, "guest-ping", nil, nil)
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := (agentCaller{d: d, dom: mustLookup(t, d, "ok")}).Call(ctx, "guest-ping", nil, nil); err != nil {
		t.Errorf("Call(ok, guest-ping) while another domain hangs = %v; want nil", err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, qga.ErrTimeout) {
			t.Errorf("Call(hung, guest-ping) = %v; want %v", err, qga.ErrTimeout)
		}
	}
	// A correctness bound (the deadline was honoured), not a speed claim.
	if took := time.Since(start); took > deadline+5*time.Second {
		t.Errorf("hung calls returned after %v; want about their %v deadline", took, deadline)
	}
}

func mustLookup(t testing.TB, d *Driver, name string) *domState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := d.lookup(ctx, "test", name)
	if err != nil {
		t.Fatalf("lookup(%q) = %v", name, err)
	}
	return s
}

// TestReconnect: a transport failure drops the connection; the next call
// dials a new one, and a lookup (which changes nothing) is retried at once.
func TestReconnect(t *testing.T) {
	broken := newFake()
	broken.lookup = func(string) (golibvirt.Domain, error) { return golibvirt.Domain{}, io.ErrUnexpectedEOF }
	broken.agent = func(golibvirt.Domain, string, int32) (golibvirt.OptString, error) { return nil, io.ErrUnexpectedEOF }
	good := newFake()
	good.agent = func(golibvirt.Domain, string, int32) (golibvirt.OptString, error) {
		return golibvirt.OptString{`{"return":{}}`}, nil
	}
	d, dials := fakeDriver(t, broken, good)
	s := mustLookup(t, d, "vm1") // first dial broken, retried on the second
	if n := dials.Load(); n != 2 {
		t.Errorf("dials after a lookup on a broken connection = %d; want 2", n)
	}
	for wait := time.Now().Add(5 * time.Second); broken.disconnected.Load() == 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond) // Disconnect runs in the background
	}
	if broken.disconnected.Load() == 0 {
		t.Errorf("broken connection was not disconnected")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := (agentCaller{d: d, dom: s}).Call(ctx, "guest-ping", nil, nil); err != nil {
		t.Errorf("Call(guest-ping) on the new connection = %v; want nil", err)
	}

	// An agent command is not retried: it may have run.
	d2, dials2 := fakeDriver(t, broken, good)
	d2.remember(golibvirt.Domain{Name: "vm1", UUID: golibvirt.UUID{1}})
	s2 := d2.doms["vm1"]
	err := agentCaller{d: d2, dom: s2}.Call(ctx, "guest-ping", nil, nil)
	if !errors.Is(err, qga.ErrConnLost) {
		t.Errorf("Call(guest-ping) on a broken connection = %v; want %v", err, qga.ErrConnLost)
	}
	if n := dials2.Load(); n != 1 {
		t.Errorf("dials after a failed agent command = %d; want 1 (no retry)", n)
	}
	if err := (agentCaller{d: d2, dom: s2}).Call(ctx, "guest-ping", nil, nil); err != nil {
		t.Errorf("next Call(guest-ping) = %v; want nil on a new connection", err)
	}
}

// TestFileChunks: file data crosses libvirt in pieces of at most
// maxFileChunk bytes (the Agent the driver makes has ChunkBytes set).
func TestFileChunks(t *testing.T) {
	var mu sync.Mutex
	var file []byte
	var pieces []int
	f := newFake()
	f.agent = func(_ golibvirt.Domain, cmd string, _ int32) (golibvirt.OptString, error) {
		var req struct {
			Execute   string `json:"execute"`
			Arguments struct {
				Handle int64  `json:"handle"`
				BufB64 string `json:"buf-b64"`
				Count  int64  `json:"count"`
			} `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(cmd), &req); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		ret := func(v any) (golibvirt.OptString, error) {
			b, _ := json.Marshal(map[string]any{"return": v})
			return golibvirt.OptString{string(b)}, nil
		}
		switch req.Execute {
		case "guest-file-open":
			return ret(7)
		case "guest-file-close":
			return ret(map[string]any{})
		case "guest-file-write":
			b, _ := base64.StdEncoding.DecodeString(req.Arguments.BufB64)
			pieces = append(pieces, len(b))
			file = append(file, b...)
			return ret(map[string]any{"count": len(b), "eof": false})
		case "guest-file-read":
			n := min(int(req.Arguments.Count), len(file))
			pieces = append(pieces, n)
			out := file[:n]
			file = file[n:]
			return ret(map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(out), "eof": len(file) == 0})
		}
		return nil, errors.New("unexpected " + req.Execute)
	}
	d, _ := fakeDriver(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := d.FileWrite(ctx, "vm1", "/tmp/x", data, 0); err != nil {
		t.Fatalf("FileWrite(300 KiB) = %v", err)
	}
	written := append([]byte(nil), file...)
	if string(written) != string(data) {
		t.Errorf("FileWrite(300 KiB) stored %d bytes, not the data written", len(written))
	}
	got, err := d.FileRead(ctx, "vm1", "/tmp/x", 1<<20)
	if err != nil || string(got.Data) != string(data) || got.Truncated {
		t.Errorf("FileRead() = %d bytes, truncated %v, %v; want the 300 KiB back", len(got.Data), got.Truncated, err)
	}
	largest := 0
	for _, n := range pieces {
		if n > maxFileChunk {
			t.Errorf("a file piece of %d bytes crossed libvirt; want at most %d", n, maxFileChunk)
		}
		largest = max(largest, n)
	}
	if largest != maxFileChunk {
		t.Errorf("largest file piece = %d bytes of %d pieces; want full pieces of %d", largest, len(pieces), maxFileChunk)
	}
}

func TestAgentErrorDesc(t *testing.T) {
	tests := []struct {
		msg  string
		desc string
		ok   bool
	}{
		{"internal error: unable to execute QEMU agent command 'guest-exec': Command guest-exec has been disabled", "Command guest-exec has been disabled", true},
		{"internal error: unable to execute QEMU agent command 'guest-exec-status': Invalid parameter 'pid'", "Invalid parameter 'pid'", true},
		{"unable to execute QEMU agent command 'x'", "", false},
		{"Guest agent is not responding", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		desc, ok := agentErrorDesc(tc.msg)
		if desc != tc.desc || ok != tc.ok {
			t.Errorf("agentErrorDesc(%q) = %q, %v; want %q, %v", tc.msg, desc, ok, tc.desc, tc.ok)
		}
	}
}

func TestHostileNames(t *testing.T) {
	f := newFake()
	var agentCalls atomic.Int64
	f.agent = func(golibvirt.Domain, string, int32) (golibvirt.OptString, error) {
		agentCalls.Add(1)
		return nil, errUnset
	}
	d, dials := fakeDriver(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"", "a/b", "../x", "a b", "-x", "x\x00", strings.Repeat("a", 129), "ünï"} {
		if _, err := d.Status(ctx, name); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Status(%q) error %v; want %v", name, err, hypervisor.ErrUnknownVM)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Errorf("hostile names caused %d dials; want none (refused before any call)", n)
	}
	for _, p := range []string{"", "rel/path", "/a\x00b"} {
		if err := d.FileWrite(ctx, "vm1", p, []byte("x"), 0); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileWrite(%q) error %v; want %v", p, err, hypervisor.ErrInvalidArgument)
		}
	}
	if err := d.FileWrite(ctx, "vm1", "/tmp/x", []byte("x"), 0o10000); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("FileWrite(mode 010000) error %v; want %v", err, hypervisor.ErrInvalidArgument)
	}
	for _, tc := range []struct {
		path string
		max  int64
	}{{"", 1}, {"rel/path", 1}, {"/a\x00b", 1}, {"/tmp/x", -1}} {
		if _, err := d.FileRead(ctx, "vm1", tc.path, tc.max); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("FileRead(%q, %d) error %v; want %v", tc.path, tc.max, err, hypervisor.ErrInvalidArgument)
		}
	}
	if n := agentCalls.Load(); n != 0 {
		t.Errorf("bad file arguments caused %d agent commands; want none", n)
	}
	for _, tok := range []string{"!!", base64.RawURLEncoding.EncodeToString([]byte(`{"pid":5,"extra":1}`)),
		base64.RawURLEncoding.EncodeToString([]byte(`{"pid":6}`))} {
		_, err := d.ExecStatus(ctx, "vm1", hypervisor.ExecHandle{PID: 5, Token: tok})
		if !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("ExecStatus(token %q) error %v; want %v", tok, err, hypervisor.ErrInvalidArgument)
		}
	}
}
