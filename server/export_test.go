package server

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// The gate's tests reach the transports, which import this package,
// through these hooks: transports_test.go (package server_test, in the same
// test binary) fills them in at init.
var (
	serveStdio  func(ctx context.Context, s *Server, grant string, in io.Reader, out io.Writer) error
	httpHandler func(s *Server) http.Handler
	// defaultHTTPRequestsPerMinute is the HTTP transport's default request
	// budget of a grant.
	defaultHTTPRequestsPerMinute int
	// startOperator serves s's operator socket in dir until t ends, and
	// returns its path.
	startOperator func(t *testing.T, s *Server, dir string) string
	// operatorUndo and operatorGrant send an undo of call, a grant of
	// approval id, over the operator socket at path.
	operatorUndo  func(ctx context.Context, path, call string) (*UndoResult, error)
	operatorGrant func(ctx context.Context, path, id string) error
)

// Transports are the hooks above, for transports_test.go.
type Transports struct {
	ServeStdio            func(ctx context.Context, s *Server, grant string, in io.Reader, out io.Writer) error
	HTTPHandler           func(s *Server) http.Handler
	HTTPRequestsPerMinute int
	StartOperator         func(t *testing.T, s *Server, dir string) string
	OperatorUndo          func(ctx context.Context, path, call string) (*UndoResult, error)
	OperatorGrant         func(ctx context.Context, path, id string) error
}

// SetTransports fills in the hooks.
func SetTransports(tr Transports) {
	serveStdio, httpHandler, startOperator = tr.ServeStdio, tr.HTTPHandler, tr.StartOperator
	defaultHTTPRequestsPerMinute = tr.HTTPRequestsPerMinute
	operatorUndo, operatorGrant = tr.OperatorUndo, tr.OperatorGrant
}
