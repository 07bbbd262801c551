package hypervisor

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// maxCallConns bounds the connections a plugin serves at once; a host opens
// one per call in flight.
const maxCallConns = 1024

// callMethod is one unary method of a registered service.
type callMethod struct {
	impl    any
	handler grpc.MethodHandler
}

// callServer is the plugin side of the call socket. It serves the services
// registered on it (grpc.ServiceRegistrar: the generated Register function
// works as for a *grpc.Server), one goroutine per connection reading a call,
// running it and writing its answer.
//
// methods is written only before serve starts. mu guards conns and closed;
// wg counts the accept and connection goroutines.
type callServer struct {
	ln      *net.UnixListener
	uid     int // the peer uid allowed to connect: this process's
	log     *slog.Logger
	methods map[string]callMethod

	mu     sync.Mutex
	conns  map[*net.UnixConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

var _ grpc.ServiceRegistrar = (*callServer)(nil)

// listenCallSocket listens on CallSocketName in dir, which must be private
// to this process's user.
func listenCallSocket(dir string, log *slog.Logger) (*callServer, error) {
	if err := checkPrivateDir(dir); err != nil {
		return nil, fmt.Errorf("call socket: socket directory: %w", err)
	}
	path := filepath.Join(dir, CallSocketName)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("call socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("call socket: %w", err)
	}
	return &callServer{ln: ln, uid: os.Geteuid(), log: log, methods: map[string]callMethod{}, conns: map[*net.UnixConn]struct{}{}}, nil
}

// RegisterService adds desc's unary methods, served by impl.
func (s *callServer) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = callMethod{impl: impl, handler: m.Handler}
	}
}

// serve accepts connections until Close.
func (s *callServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("call socket: accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed || len(s.conns) >= maxCallConns {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// start serves in the background.
func (s *callServer) start() {
	s.wg.Add(1)
	go s.serve()
}

// Close stops accepting, closes every connection (cancelling the calls on
// them once they have run watchAfter) and waits for the calls to return.
func (s *callServer) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.Close()
	}
	s.wg.Wait()
	return err
}

// callRequest is one decoded call frame.
type callRequest struct {
	method  string
	timeout time.Duration // 0: none
	payload []byte        // valid until the next read of the connection's reader
}

// parseRequest decodes a call frame's body.
func parseRequest(typ byte, body []byte) (callRequest, error) {
	if typ != frameCall || len(body) < 1 {
		return callRequest{}, fmt.Errorf("call socket: frame type %d; want a call", typ)
	}
	n := int(body[0])
	if len(body) < 1+n+8 {
		return callRequest{}, errors.New("call socket: short call frame")
	}
	return callRequest{
		method:  string(body[1 : 1+n]),
		timeout: time.Duration(binary.BigEndian.Uint64(body[1+n:])),
		payload: body[1+n+8:],
	}, nil
}

// serveConn reads a connection's calls and runs each in turn, in this
// goroutine (the host sends a call only once it has the answer to the
// previous one).
func (s *callServer) serveConn(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if uid, err := peerUID(c); err != nil || uid != s.uid {
		s.log.Error("call socket: connection refused", "peer_uid", uid, "err", err)
		return
	}
	r := bufio.NewReaderSize(c, 16<<10)
	if err := exchangeHello(c, r); err != nil {
		s.log.Error("call socket: connection refused", "err", err)
		return
	}
	for {
		typ, body, err := readFrame(r)
		if err != nil {
			return // the host closed it
		}
		req, err := parseRequest(typ, body)
		if err != nil {
			s.log.Error("call socket: bad request; connection closed", "err", err)
			return
		}
		if !s.call(c, req) {
			return
		}
	}
}

// watchAfter is how long a call runs before its connection is watched for
// the host cancelling it (closing the connection). Shorter calls are not
// worth a goroutine.
const watchAfter = time.Millisecond

// call runs one request and writes its answer; false when the connection is
// done for (the host cancelled the call, or the answer could not be written).
func (s *callServer) call(c *net.UnixConn, req callRequest) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if req.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, req.timeout)
		defer cancel()
	}
	// While the call runs, nothing else may arrive on the connection: a
	// watcher started once the call has run watchAfter reads it, and the end
	// of the stream (or anything else) cancels the call.
	gone := make(chan bool, 1)
	watcher := time.AfterFunc(watchAfter, func() {
		var one [1]byte
		_, err := c.Read(one[:])
		ended := !errors.Is(err, os.ErrDeadlineExceeded)
		if ended {
			cancel()
		}
		gone <- ended
	})
	frame := s.run(ctx, req)
	if !watcher.Stop() {
		c.SetReadDeadline(longAgo) // unblocks the watcher's read
		ended := <-gone
		c.SetReadDeadline(time.Time{})
		if ended {
			return false
		}
	}
	if _, err := c.Write(frame); err != nil {
		s.log.Warn("call socket: answer not delivered", "method", req.method, "err", err)
		return false
	}
	return true
}

// run runs one request's method and encodes its answer.
func (s *callServer) run(ctx context.Context, req callRequest) []byte {
	m, ok := s.methods[req.method]
	if !ok {
		return statusFrame(status.New(codes.Unimplemented, fmt.Sprintf("call socket: unknown method %q", req.method)))
	}
	dec := func(v any) error {
		msg, ok := v.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "call socket: %T is not a protobuf message", v)
		}
		if err := proto.Unmarshal(req.payload, msg); err != nil {
			return status.Errorf(codes.InvalidArgument, "call socket: undecodable request: %v", err)
		}
		return nil
	}
	resp, err := m.handler(m.impl, ctx, dec, nil)
	return answerFrame(resp, err)
}

// answerFrame encodes a method's result: its response, or its error as a
// status (an error that is not one becomes Unknown, as gRPC does).
func answerFrame(resp any, err error) []byte {
	if err != nil {
		return statusFrame(status.Convert(err))
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return statusFrame(status.New(codes.Internal, fmt.Sprintf("call socket: %T is not a protobuf message", resp)))
	}
	b, merr := proto.MarshalOptions{}.MarshalAppend(appendFrameHeader(nil, frameReply), msg)
	if merr == nil {
		if b, merr = finishFrame(b, frameHeaderBytes); merr == nil {
			return b
		}
	}
	code := codes.Internal
	if errors.Is(merr, errFrameTooLarge) {
		code = codes.ResourceExhausted
	}
	return statusFrame(status.New(code, fmt.Sprintf("call socket: response: %v", merr)))
}

// statusFrame encodes st; a status too large to send is cut to its code
// and the start of its message.
func statusFrame(st *status.Status) []byte {
	b, err := proto.MarshalOptions{}.MarshalAppend(appendFrameHeader(nil, frameStatus), st.Proto())
	if err == nil {
		if b, err = finishFrame(b, frameHeaderBytes); err == nil {
			return b
		}
	}
	msg := st.Message()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	b, _ = proto.MarshalOptions{}.MarshalAppend(appendFrameHeader(nil, frameStatus), status.New(st.Code(), msg).Proto())
	b, _ = finishFrame(b, frameHeaderBytes)
	return b
}
