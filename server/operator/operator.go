// Package operator is the operator socket of a running vmgate serve: a
// unix socket in the state directory (mode 0600) on which `vmgate
// approvals` and `vmgate undo` list, show, grant and deny parked calls and
// revert a call's VM to its undo snapshot, one JSON request and one JSON
// response per connection. The operator is who the kernel says
// (SO_PEERCRED). Listen serves it; Call is its client.
//
// Only cmd/vmgate imports it.
package operator

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// The operator socket is how `vmgate approvals` reaches a running server:
// a unix socket in the state directory (mode 0600) speaking one JSON
// request and one JSON response per connection, each a single line.
//
// The operator is identified by the kernel, not by what the client says:
// the server reads the peer's uid (SO_PEERCRED) and records the local user
// name in the audit log. Only the owner of the socket (and root) can
// connect, because of its mode.

// SocketName is the operator socket's file name in the state directory.
const SocketName = "operator.sock"

// operatorLockName is the lock file held by the server that owns the socket.
const operatorLockName = "operator.lock"

// maxRequest bounds one request line.
const maxRequest = 64 << 10

// maxResponse bounds one response line (show of an approval with
// 16 MiB of binary arguments, as a hex dump in JSON, stays below it).
const maxResponse = 256 << 20

// operatorTimeout bounds one operator connection.
const operatorTimeout = 30 * time.Second

// The operator operations.
const (
	OpList  = "list"
	OpShow  = "show"
	OpGrant = "grant"
	OpDeny  = "deny"
	OpUndo  = "undo" // ID: the call id (server.Undo)
)

// undoTimeout bounds an undo over the operator socket (a revert loads a
// VM's memory).
const undoTimeout = 10 * time.Minute

// Request is one request on the operator socket.
type Request struct {
	Op     string `json:"op"`               // list, show, grant or deny
	ID     string `json:"id,omitempty"`     // the approval id (show, grant, deny)
	Reason string `json:"reason,omitempty"` // why (grant, deny)
}

// Response is the server's answer. list carries every approval with its
// arguments cut to server.ApprovalPreviewBytes each; show one approval
// with all of its arguments.
type Response struct {
	Error     string                `json:"error,omitempty"`
	Operator  string                `json:"operator,omitempty"` // who the server took the caller to be
	Approvals []server.ApprovalView `json:"approvals,omitempty"`
	Approval  *server.ApprovalView  `json:"approval,omitempty"`
	Undo      *server.UndoResult    `json:"undo,omitempty"` // undo (server/undo_operator.go)
}

// ErrBusy: another live server owns the operator socket of the state directory.
var ErrBusy = errors.New("another vmgate server owns the operator socket")

// Error is a refusal the server sent over the operator socket.
type Error struct{ Msg string }

func (e *Error) Error() string { return "server refused: " + e.Msg }

// Listener serves the operator socket of one server.
type Listener struct {
	s    *server.Server
	path string
	ln   *net.UnixListener
	lock *os.File

	// mu guards closed; conns counts the connections being served.
	mu     sync.Mutex
	closed bool
	conns  sync.WaitGroup
}

// Listen creates the operator socket of s at path (mode 0600). It holds an
// exclusive lock on a lock file beside it while it runs, so a socket left
// by a crashed server is replaced safely, and a live server's socket is
// never taken over (ErrBusy).
func Listen(s *server.Server, path string) (*Listener, error) {
	dir := filepath.Dir(path)
	// The socket is bound under a temporary name 16 bytes longer than
	// path; sun_path holds 107 bytes.
	if path == "" || len(dir)+len("/.operator-0123456789.sock") > 107 || len(path) > 107 {
		return nil, fmt.Errorf("server: operator socket: path %q is empty or too long for a unix socket", path)
	}
	lock, err := os.OpenFile(filepath.Join(dir, operatorLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: operator socket: lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("server: operator socket %s: %w", path, ErrBusy)
		}
		return nil, fmt.Errorf("server: operator socket: lock: %w", err)
	}
	fail := func(err error) (*Listener, error) {
		lock.Close()
		return nil, fmt.Errorf("server: operator socket: %w", err)
	}
	// With the lock held, whatever is at path is a stale socket of a
	// server that died. Remove it only if it is a socket.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fail(fmt.Errorf("%s exists and is not a socket; not replacing it", path))
		}
		if err := os.Remove(path); err != nil {
			return fail(err)
		}
	}
	// Bind under a temporary name, restrict it, then move it into place, so
	// the socket is never reachable with a wider mode.
	tmp := filepath.Join(dir, ".operator-"+rand.Text()[:10]+".sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fail(err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return fail(err)
	}
	return &Listener{s: s, path: path, ln: ln, lock: lock}, nil
}

// Path is the socket's path.
func (o *Listener) Path() string { return o.path }

// Serve answers operator requests until ctx is done or Close is called.
func (o *Listener) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { o.Close() })
	defer stop()
	for {
		c, err := o.ln.AcceptUnix()
		if err != nil {
			o.mu.Lock()
			closed := o.closed
			o.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("server: operator socket: accept: %w", err)
		}
		o.mu.Lock()
		if o.closed {
			o.mu.Unlock()
			c.Close()
			return nil
		}
		o.conns.Add(1)
		o.mu.Unlock()
		go func() {
			defer o.conns.Done()
			o.serveConn(ctx, c)
		}()
	}
}

// Close stops accepting, waits for the requests being served, removes the
// socket and releases the lock. It is safe to call more than once.
func (o *Listener) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	o.mu.Unlock()
	err := o.ln.Close()
	o.conns.Wait()
	if rerr := os.Remove(o.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	o.lock.Close() // releases the flock
	if err != nil {
		return fmt.Errorf("server: operator socket: close: %w", err)
	}
	return nil
}

func (o *Listener) serveConn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(operatorTimeout))
	resp := o.answer(ctx, c)
	b, err := json.Marshal(resp)
	if err != nil {
		b, _ = json.Marshal(Response{Error: "cannot encode the response"})
	}
	_, _ = c.Write(append(b, '\n'))
}

func (o *Listener) answer(ctx context.Context, c *net.UnixConn) Response {
	who, err := peerUser(c)
	if err != nil {
		o.s.Logger().Warn("server: operator socket: unknown peer", "err", err)
		return Response{Error: "cannot identify the caller: " + err.Error()}
	}
	line, err := readLine(c, maxRequest)
	if err != nil {
		return Response{Operator: who, Error: "bad request: " + err.Error()}
	}
	req, err := decodeRequest(line)
	if err != nil {
		return Response{Operator: who, Error: "bad request: " + err.Error()}
	}
	a := o.s.Approvals()
	switch req.Op {
	case OpUndo:
		_ = c.SetDeadline(time.Now().Add(undoTimeout))
		u, err := o.s.Undo(ctx, req.ID, who)
		resp := Response{Operator: who, Undo: &u}
		if err != nil {
			resp.Error = err.Error()
		}
		return resp
	case OpList:
		list, err := a.List(ctx)
		if err != nil {
			return Response{Operator: who, Error: err.Error()}
		}
		views := make([]server.ApprovalView, len(list))
		for i, ap := range list {
			views[i] = server.View(ap, server.ApprovalPreviewBytes)
		}
		return Response{Operator: who, Approvals: views}
	case OpShow:
		ap, err := a.Get(ctx, req.ID)
		if err != nil {
			return Response{Operator: who, Error: err.Error()}
		}
		v := server.View(ap, 0)
		return Response{Operator: who, Approval: &v}
	case OpGrant, OpDeny:
		decide := a.Grant
		if req.Op == OpDeny {
			decide = a.Deny
		}
		ap, err := decide(ctx, req.ID, who, req.Reason)
		if err != nil {
			return Response{Operator: who, Error: err.Error()}
		}
		o.s.Logger().Info("server: approval decided", "op", req.Op, "id", req.ID, "operator", who)
		v := server.View(ap, server.ApprovalPreviewBytes)
		return Response{Operator: who, Approval: &v}
	}
	return Response{Operator: who, Error: "unreachable"}
}

// decodeRequest decodes one request strictly and validates it.
func decodeRequest(line []byte) (Request, error) {
	v, err := jsonrpc.Decode(line)
	if err != nil {
		return Request{}, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Request{}, errors.New("a request must be a JSON object")
	}
	var req Request
	for k, val := range m {
		s, ok := val.(string)
		if !ok {
			return Request{}, fmt.Errorf("%q must be a string", catalog.Truncate(k, 40))
		}
		switch k {
		case "op":
			req.Op = s
		case "id":
			req.ID = s
		case "reason":
			req.Reason = s
		default:
			return Request{}, fmt.Errorf("unknown member %q", catalog.Truncate(k, 40))
		}
	}
	switch req.Op {
	case OpList:
		if req.ID != "" || req.Reason != "" {
			return Request{}, errors.New("list takes no id or reason")
		}
	case OpShow:
		if req.ID == "" || req.Reason != "" {
			return Request{}, errors.New("show takes an approval id and no reason")
		}
	case OpUndo:
		if req.ID == "" || req.Reason != "" {
			return Request{}, errors.New("undo takes a call id and no reason")
		}
	case OpGrant, OpDeny:
		if req.ID == "" {
			return Request{}, fmt.Errorf("%s needs an approval id", req.Op)
		}
		if len(req.Reason) > 1024 {
			return Request{}, errors.New("reason is longer than 1024 bytes")
		}
		for _, r := range req.Reason {
			if r < 0x20 || r == 0x7f {
				return Request{}, errors.New("reason contains control characters")
			}
		}
	default:
		return Request{}, fmt.Errorf("unknown op %q (want list, show, grant, deny or undo)", catalog.Truncate(req.Op, 40))
	}
	return req, nil
}

// readLine reads one newline-terminated line of at most max bytes (the
// newline may be missing at EOF).
func readLine(r io.Reader, max int) ([]byte, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, int64(max)+1), 4096)
	line, err := br.ReadBytes('\n')
	if len(line) > max {
		return nil, fmt.Errorf("request longer than %d bytes", max)
	}
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty request")
		}
		return nil, err
	}
	return line, nil
}

// peerUser names the local user at the other end of c, from the kernel's
// peer credentials.
func peerUser(c *net.UnixConn) (string, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return "", err
	}
	if credErr != nil {
		return "", credErr
	}
	uid := strconv.FormatUint(uint64(cred.Uid), 10)
	if u, err := user.LookupId(uid); err == nil && u.Username != "" {
		return u.Username, nil
	}
	return "uid:" + uid, nil
}

// Call sends one request to the operator socket at path and returns the
// server's answer; a refusal is an *Error.
func Call(ctx context.Context, path string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Response{}, fmt.Errorf("operator: connect %s: %w (is vmgate serve running with this state directory?)", path, err)
	}
	defer c.Close()
	timeout := operatorTimeout
	if req.Op == OpUndo {
		timeout = undoTimeout
	}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	b, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("operator: %w", err)
	}
	if _, err := c.Write(append(b, '\n')); err != nil {
		return Response{}, fmt.Errorf("operator: send: %w", err)
	}
	line, err := readLine(c, maxResponse)
	if err != nil {
		return Response{}, fmt.Errorf("operator: read: %w", err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("operator: decode: %w", err)
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("operator: %s: %w", req.Op, &Error{Msg: resp.Error})
	}
	return resp, nil
}
