package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// ErrAgentBusy is the guest agent's socket held by another client. QEMU's
// socket chardev serves one client at a time: while one is connected (a
// running `vmgate serve` keeps its QEMU driver's connection), a second
// connect succeeds but waits in the listen backlog and nothing answers it,
// which looks exactly like an agent that is not running.
var ErrAgentBusy = errors.New("another client holds the guest agent's connection (QEMU serves one at a time)")

// AgentStatus is AgentInfo for a status display: when another client holds
// the agent's socket it returns ErrAgentBusy (wrapped with
// hypervisor.ErrAgentUnavailable) at once, without queueing behind that
// client.
func (v *VM) AgentStatus(ctx context.Context) (hypervisor.AgentInfo, error) {
	if heldFor(ctx, v.QGASocket, busySettle) {
		return hypervisor.AgentInfo{}, fmt.Errorf("lab: agent: %w: %w", hypervisor.ErrAgentUnavailable, ErrAgentBusy)
	}
	info, err := v.AgentInfo(ctx)
	if err != nil {
		// Another client may have connected first while we waited.
		if held, herr := SocketHeld(v.QGASocket); herr == nil && held {
			return hypervisor.AgentInfo{}, fmt.Errorf("lab: agent: %w: %w", hypervisor.ErrAgentUnavailable, ErrAgentBusy)
		}
	}
	return info, err
}

// busySettle is how long a connection must stay in the socket table to
// count as another client's: one that just hung up (a ping a moment ago)
// stays listed until QEMU's main loop closes its end.
const busySettle = time.Second

// heldFor reports whether the socket at path is held throughout d (looked
// at every 20 ms); false at once when it is free or the table unreadable.
func heldFor(ctx context.Context, path string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if held, err := SocketHeld(path); err != nil || !held {
			return false
		}
		if time.Now().After(deadline) {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SocketHeld reports whether some client is connected to (or waiting in
// the backlog of) the listening Unix socket at path, from the kernel's
// table of Unix sockets (/proc/net/unix): the server side of an accepted
// or pending connection carries the listener's path.
func SocketHeld(path string) (bool, error) {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return false, fmt.Errorf("lab: socket table: %w", err)
	}
	defer f.Close()
	return socketHeld(f, path)
}

// Socket states in /proc/net/unix (the kernel's socket_state).
const (
	ssConnecting = "02"
	ssConnected  = "03"
)

// socketHeld reads a /proc/net/unix table: "Num RefCount Protocol Flags
// Type St Inode Path", one socket a line.
func socketHeld(r io.Reader, path string) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 || strings.Join(f[7:], " ") != path {
			continue
		}
		if f[5] == ssConnected || f[5] == ssConnecting {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("lab: socket table: %w", err)
	}
	return false, nil
}
