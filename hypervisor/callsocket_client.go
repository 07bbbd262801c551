package hypervisor

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// maxIdleCalls bounds the connections a callClient keeps open between
// calls; more calls in flight open more, closed when they are done.
const maxIdleCalls = MaxIdleCallConns

// MaxIdleCallConns is how many idle call-socket connections the server
// keeps to one plugin between calls: after a burst of calls in flight it
// holds up to this many more fds per plugin, and no more.
const MaxIdleCallConns = 16

// callClient is the host side of a plugin's call socket: a
// grpc.ClientConnInterface (what pb.NewDriverClient needs) whose unary
// calls each use a connection of their own, taken from a pool or dialed.
// It is safe for concurrent use; mu guards idle and closed.
type callClient struct {
	path string

	mu     sync.Mutex
	idle   []*callConn
	closed bool
}

var _ grpc.ClientConnInterface = (*callClient)(nil)

// callConn is one connection: requests are written from buf, answers read
// through r.
type callConn struct {
	c   *net.UnixConn
	r   *bufio.Reader
	buf []byte
}

// longAgo is a deadline that has passed: setting it unblocks a connection's
// reads and writes at once.
var longAgo = time.Unix(1, 0)

// dialCallSocket connects to the call socket in a plugin's socket directory
// dir. It returns an error wrapping os.ErrNotExist when the plugin offers
// none (it predates the call socket: the caller stays on gRPC), and any
// other error when the directory is not private or the socket does not
// speak the protocol.
func dialCallSocket(ctx context.Context, dir string) (*callClient, error) {
	if err := checkPrivateDir(dir); err != nil {
		return nil, fmt.Errorf("call socket: socket directory: %w", err)
	}
	c := &callClient{path: filepath.Join(dir, CallSocketName)}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.put(cn)
	return c, nil
}

// dial opens a connection and exchanges the hello.
func (c *callClient) dial(ctx context.Context) (*callConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, fmt.Errorf("call socket: %w", err)
	}
	uc := nc.(*net.UnixConn)
	cn := &callConn{c: uc, r: bufio.NewReaderSize(uc, 16<<10)}
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	if err := exchangeHello(uc, cn.r); err != nil {
		uc.Close()
		return nil, fmt.Errorf("call socket %s: %w", c.path, err)
	}
	uc.SetDeadline(time.Time{})
	return cn, nil
}

// get returns an idle connection or dials one.
func (c *callClient) get(ctx context.Context) (*callConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, net.ErrClosed
	}
	if n := len(c.idle); n > 0 {
		cn := c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cn, nil
	}
	c.mu.Unlock()
	return c.dial(ctx)
}

// put returns a connection whose last call completed cleanly to the pool.
func (c *callClient) put(cn *callConn) {
	c.mu.Lock()
	if !c.closed && len(c.idle) < maxIdleCalls {
		c.idle = append(c.idle, cn)
		cn = nil
	}
	c.mu.Unlock()
	if cn != nil {
		cn.c.Close()
	}
}

// Close closes the idle connections; calls in flight finish on theirs,
// later calls fail as Unavailable.
func (c *callClient) Close() error {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	for _, cn := range idle {
		cn.c.Close()
	}
	return nil
}

// Invoke makes one unary call. Errors are status errors, as gRPC's are: the
// plugin's own (with their details), Canceled or DeadlineExceeded when ctx
// ended first, Unavailable when the connection failed (the plugin may have
// exited), ResourceExhausted for a message over MaxMessageBytes.
func (c *callClient) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	req, ok1 := args.(proto.Message)
	resp, ok2 := reply.(proto.Message)
	if !ok1 || !ok2 {
		return status.Errorf(codes.Internal, "call socket: %s: messages must be protobuf messages", method)
	}
	if len(method) > 255 {
		return status.Errorf(codes.Internal, "call socket: method name of %d bytes", len(method))
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	cn, err := c.get(ctx)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return status.FromContextError(cerr).Err()
		}
		return status.Errorf(codes.Unavailable, "call socket: %v", err)
	}
	frame, err := cn.encode(ctx, method, req)
	if err != nil {
		c.put(cn) // nothing was written: the connection is clean
		code := codes.Internal
		if errors.Is(err, errFrameTooLarge) {
			code = codes.ResourceExhausted
		}
		return status.Errorf(code, "call socket: %s: request: %v", method, err)
	}
	// The context's end cuts the connection: the blocked write or read
	// returns, and the plugin sees the stream end and cancels the call.
	stop := context.AfterFunc(ctx, func() { cn.c.SetDeadline(longAgo) })
	typ, body, err := cn.exchange(frame)
	if !stop() {
		cn.c.Close()
		return status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cn.c.Close()
		return status.Errorf(codes.Unavailable, "call socket: %s: %v", method, err)
	}
	err = decodeAnswer(typ, body, resp)
	if status.Code(err) == codes.Internal {
		cn.c.Close() // the stream is in doubt
		return err
	}
	c.put(cn)
	return err
}

// encode builds the request frame for one call in cn's buffer.
func (cn *callConn) encode(ctx context.Context, method string, req proto.Message) ([]byte, error) {
	b := appendFrameHeader(cn.buf[:0], frameCall)
	b = append(b, byte(len(method)))
	b = append(b, method...)
	var timeout int64
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(int64(time.Until(dl)), 1)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(timeout))
	msg := len(b)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, req)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	if b, err = finishFrame(b, msg); err != nil {
		return nil, err
	}
	if cap(b) <= 64<<10 {
		cn.buf = b
	}
	return b, nil
}

// exchange writes one request frame and reads its answer. The answer's body
// is valid until the next read on cn.
func (cn *callConn) exchange(frame []byte) (byte, []byte, error) {
	if _, err := cn.c.Write(frame); err != nil {
		return 0, nil, err
	}
	return readFrame(cn.r)
}

// decodeAnswer turns a response frame into reply or the status error it
// carries.
func decodeAnswer(typ byte, body []byte, reply proto.Message) error {
	switch typ {
	case frameReply:
		if err := proto.Unmarshal(body, reply); err != nil {
			return status.Errorf(codes.Internal, "call socket: undecodable reply: %v", err)
		}
		return nil
	case frameStatus:
		st := &spb.Status{}
		if err := proto.Unmarshal(body, st); err != nil {
			return status.Errorf(codes.Internal, "call socket: undecodable status: %v", err)
		}
		if st.GetCode() == int32(codes.OK) {
			return status.Errorf(codes.Internal, "call socket: error frame with code OK: %s", st.GetMessage())
		}
		return status.ErrorProto(st)
	default:
		return status.Errorf(codes.Internal, "call socket: unknown frame type %d", typ)
	}
}

// NewStream is not offered: the Driver service has no streaming methods.
func (c *callClient) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "call socket: streams are not supported")
}
