package lab_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// TestAgentStatusBusy: while another client holds a lab VM's agent socket
// (as a running vmgate serve does), AgentStatus says the agent is busy, at
// once, instead of timing out as if it were not running; once the client
// leaves, the agent answers again.
func TestAgentStatusBusy(t *testing.T) {
	vm := labtest.VM(t, "t1")
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := vm.AgentStatus(ctx); err != nil {
		t.Fatalf("AgentStatus() with no other client = %v", err)
	}
	holder, err := net.Dial("unix", vm.QGASocket)
	if err != nil {
		t.Fatal(err)
	}
	// The holder is accepted once QEMU sees it: wait for that condition.
	for held := false; !held; {
		if held, err = lab.SocketHeld(vm.QGASocket); err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("the holder's connection never showed in the socket table")
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not synchronisation
	}
	start := time.Now()
	_, err = vm.AgentStatus(ctx)
	if !errors.Is(err, lab.ErrAgentBusy) {
		t.Errorf("AgentStatus() while another client holds the socket = %v; want ErrAgentBusy", err)
	}
	if d := time.Since(start); d > testload.Scale(5*time.Second) {
		t.Errorf("AgentStatus() while busy took %s; want an answer without waiting on the agent", d)
	}
	holder.Close()
	for {
		_, err := vm.AgentStatus(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("AgentStatus() after the holder left = %v; want the agent's answer", err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}
