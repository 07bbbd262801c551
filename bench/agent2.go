package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// A second guest agent on a lab VM, for the baselines of rows 1a and 1c.
//
// A guest agent socket takes one client at a time, and the server's QEMU
// driver keeps its connection, so a baseline on the same agent can run only
// while the server is stopped: in another block of execs, seconds away from
// the gated ones. The TCG guest's speed drifts between such blocks by more
// than the difference row 1a measures (in one round, raw medians of 13.8 ms
// before the server and 17.6 ms after it). So vm1 gets a second agent for
// the bench: QEMU a second virtio-serial port (chardev-add and device_add
// over QMP), the guest a second qemu-ga on it, the same binary as the
// first. Gated and raw execs then alternate one by one on the same guest at
// the same time, and row 1d checks that the two agents are alike.

// benchPort is the second agent's virtio-serial port name, benchChardev
// its QEMU chardev and device id.
const (
	benchPort    = "org.vmgate.bench.0"
	benchChardev = "qgabench"
)

// startAgentScript makes the device node of the port named $1 once the
// guest has seen it (the lab guest has no udev; its /init does the same
// for the first port), then starts a daemonized qemu-ga on it.
const startAgentScript = `i=0
while :; do
	for p in /sys/class/virtio-ports/*; do
		[ "$(cat "$p/name" 2>/dev/null)" = "$1" ] || continue
		d=$(cat "$p/dev")
		[ -e "/dev/virtio-ports/$1" ] || mknod "/dev/virtio-ports/$1" c "${d%%:*}" "${d##*:}" || exit 1
		exec qemu-ga -m virtio-serial -p "/dev/virtio-ports/$1" -f /run/qga-bench.pid -d
	done
	i=$((i + 1))
	[ "$i" -lt 200 ] || { echo "port $1 did not appear in /sys/class/virtio-ports" >&2; exit 1; }
	sleep 0.05 2>/dev/null || sleep 1
done`

// addAgent gives vm a second guest agent and returns its socket. Call it
// while nothing else holds vm's agent socket.
func addAgent(ctx context.Context, vm *lab.VM) (string, error) {
	sock := filepath.Join(vm.Dir, "qga-bench.sock")
	if err := addPort(ctx, vm.QMPSocket, sock); err != nil {
		return "", fmt.Errorf("second agent on %s: %w", vm.Name, err)
	}
	if err := startAgent(ctx, vm.QGASocket); err != nil {
		return "", fmt.Errorf("second agent on %s: %w", vm.Name, err)
	}
	if err := awaitAgent(ctx, sock); err != nil {
		return "", fmt.Errorf("second agent on %s: %w", vm.Name, err)
	}
	return sock, nil
}

// addPort plugs a virtio-serial port named benchPort into the VM whose QMP
// socket is qmpSock, backed by a listening socket at sock.
func addPort(ctx context.Context, qmpSock, sock string) error {
	m := qemu.NewMonitor("unix", qmpSock, qemu.MonitorOptions{})
	if err := m.ConnectContext(ctx); err != nil {
		return err
	}
	defer m.Disconnect()
	server, wait := true, false
	if _, err := raw.NewMonitor(m).ChardevAdd(benchChardev, raw.ChardevBackendSocket{
		Addr: raw.SocketAddressLegacyUnix{Path: sock}, Server: &server, Wait: &wait,
	}); err != nil {
		return fmt.Errorf("chardev-add: %w", err)
	}
	// raw.DeviceAdd takes no device properties; the port needs chardev and name.
	cmd, err := json.Marshal(map[string]any{"execute": "device_add", "arguments": map[string]string{
		"driver": "virtserialport", "chardev": benchChardev, "name": benchPort, "id": benchChardev}})
	if err != nil {
		return err
	}
	if _, err := m.RunContext(ctx, cmd); err != nil { // an error reply is a *qemu.QMPError
		return fmt.Errorf("device_add: %w", err)
	}
	return nil
}

// startAgent runs startAgentScript through the VM's own agent at qgaSock.
func startAgent(ctx context.Context, qgaSock string) error {
	c := qga.New(qgaSock)
	defer c.Close()
	st, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c", startAgentScript, "sh", benchPort},
		Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("start qemu-ga: %w", err)
	}
	if st.TimedOut || st.ExitCode != 0 {
		return fmt.Errorf("start qemu-ga: exit %d: %s%s", st.ExitCode, st.Stdout, st.Stderr)
	}
	return nil
}

// awaitAgent waits until the agent at sock answers a ping.
func awaitAgent(ctx context.Context, sock string) error {
	var b hypervisor.Backoff
	for {
		c := qga.New(sock, qga.WithCallTimeout(time.Second))
		err := c.Ping(ctx)
		c.Close()
		if err == nil {
			return nil
		}
		if serr := b.Sleep(ctx, 0); serr != nil {
			return fmt.Errorf("qemu-ga on %s: %w (last: %w)", sock, serr, err)
		}
	}
}
