package server_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/mcphttp"
	"github.com/vmgate/vmgate/server/operator"
	"github.com/vmgate/vmgate/server/stdio"
)

// The gate's tests drive calls through the real transports, which import
// the gate: this file hands them over (export_test.go).
func init() {
	server.SetTransports(server.Transports{
		ServeStdio:            stdio.Serve,
		HTTPHandler:           func(s *server.Server) http.Handler { return mcphttp.New(s, mcphttp.Options{}) },
		HTTPRequestsPerMinute: mcphttp.DefaultRequestsPerMinute,
		StartOperator:         startOperator,
		OperatorUndo: func(ctx context.Context, path, call string) (*server.UndoResult, error) {
			resp, err := operator.Call(ctx, path, operator.Request{Op: operator.OpUndo, ID: call})
			return resp.Undo, err
		},
		OperatorGrant: func(ctx context.Context, path, id string) error {
			_, err := operator.Call(ctx, path, operator.Request{Op: operator.OpGrant, ID: id})
			return err
		},
	})
}

func startOperator(t *testing.T, s *server.Server, dir string) string {
	t.Helper()
	o, err := operator.Listen(s, filepath.Join(dir, operator.SocketName))
	if err != nil {
		t.Fatalf("operator.Listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- o.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := o.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return o.Path()
}
