package qemu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// The helper's port, heard through QMP events.
//
// QEMU emits VSERPORT_CHANGE {id, open} when the guest opens or closes a
// virtio-serial port whose device has an id (hw/char/virtio-console.c,
// set_guest_connected). The resident helper holds its port open while it
// runs and the guest kernel closes it when the helper exits or dies, so
// open false means the channel's connection talks to nobody: the driver
// drops it at once (helperchan.Pool.Drop) instead of waiting out the
// silence limit; the next call dials again, finds no helper, and is not
// sent (guestctl then starts the helper again).
//
// The watch holds a QMP monitor of its own (a lab VM's events.sock, a
// configured VM's events socket), never the VM's QMP socket, which serves
// one client at a time and which the driver and other tools connect to per
// operation. It starts with the first helper call to the VM and ends with
// its connection (the VM stopped) or Close; the next helper call starts it
// again. Without an events socket, or when the port's device has no id,
// nothing watches and the silence limit alone finds a dead helper.

// errPortClosed: QEMU said the guest closed the helper's port.
var errPortClosed = errors.New("QEMU reported that the guest closed the helper's port (VSERPORT_CHANGE, open false): the resident helper is gone")

// watchConnect bounds connecting the events monitor and finding the
// port's device (a monitor another client holds accepts the connection
// and never greets).
const watchConnect = 5 * time.Second

// watchRetry is how long a watch that could not start is not tried again.
const watchRetry = time.Minute

// watchWait bounds how long a helper call waits for a starting watch to
// listen (one that takes longer, such as on a monitor another client
// holds, goes on starting behind the call).
const watchWait = time.Second

// watchHelper starts vm's watch unless it runs, and returns once it
// listens (or could not start, or after watchWait), so that a helper that
// dies after the first call is heard.
func (d *Driver) watchHelper(vm *vmState) {
	if vm.eventsPath == "" {
		return
	}
	vm.mu.Lock()
	if vm.watching || time.Now().Before(vm.watchAgain) {
		vm.mu.Unlock()
		return
	}
	vm.watching = true
	vm.mu.Unlock()
	listening := make(chan struct{})
	d.watchers.Add(1)
	go func() {
		defer d.watchers.Done()
		listened, err := d.watch(vm, listening)
		vm.mu.Lock()
		vm.watching = false
		if !listened {
			vm.watchAgain = time.Now().Add(watchRetry)
		}
		vm.mu.Unlock()
		if listened {
			d.log.Debug("the helper port's watch ended", "vm", vm.name, "err", err)
		} else {
			d.log.Warn("cannot watch the helper's port; a helper that dies is found by the silence limit", "vm", vm.name, "err", err, "retry_in", watchRetry)
		}
	}()
	t := time.NewTimer(watchWait)
	defer t.Stop()
	select {
	case <-listening:
	case <-t.C:
	}
}

// watch listens to vm's events monitor until it closes or the driver
// does, dropping the helper channel's connection when the guest closes
// the port. listening is closed once it listens or failed to; listened
// says which.
func (d *Driver) watch(vm *vmState, listening chan struct{}) (listened bool, _ error) {
	once := func() {
		select {
		case <-listening:
		default:
			close(listening)
		}
	}
	defer once()
	mon := d.newEventsMonitor(vm.eventsPath)
	cctx, cancel := context.WithTimeout(d.ctx, watchConnect)
	defer cancel()
	if err := mon.ConnectContext(cctx); err != nil {
		return false, fmt.Errorf("events monitor %s: %w", vm.eventsPath, err)
	}
	defer mon.Disconnect()
	events, err := mon.Events(d.ctx)
	if err != nil {
		return false, err
	}
	ids, err := helperDevices(cctx, mon)
	if err != nil {
		return false, err
	}
	once()
	for ev := range events {
		id, _ := ev.Data["id"].(string)
		if open, _ := ev.Data["open"].(bool); ev.Event != "VSERPORT_CHANGE" || open || !ids[id] {
			continue
		}
		cause := fmt.Errorf("%w (device %s)", errPortClosed, id)
		d.log.Info("helper channel dropped", "vm", vm.name, "cause", cause)
		d.helpers.Drop(vm.helperPath, cause)
	}
	return true, errors.New("the events monitor closed")
}

// helperDevices finds the ids of the devices whose port is the helper's
// (qom-list of /machine/peripheral, where devices with an id live, then
// each virtserialport's name).
func helperDevices(ctx context.Context, mon monitor) (map[string]bool, error) {
	s := qmpSession{ctx: ctx, m: mon}
	var list []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	if err := s.Run("qom-list", map[string]any{"path": "/machine/peripheral"}, &list); err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, p := range list {
		if p.Type != "child<virtserialport>" {
			continue
		}
		var name string
		if err := s.Run("qom-get", map[string]any{"path": "/machine/peripheral/" + p.Name, "property": "name"}, &name); err != nil {
			return nil, err
		}
		if name == helperchan.PortName {
			ids[p.Name] = true
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no virtserialport with an id carries %s (give the device an id: QEMU reports the port's events only then)", helperchan.PortName)
	}
	return ids, nil
}
