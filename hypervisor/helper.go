package hypervisor

import (
	"context"
	"errors"
	"time"
)

// HelperCaller is an optional capability: a driver with a channel of its
// own to vmgate-guest's resident helper in its VMs (QEMU and libvirt: the
// virtio-serial port org.vmgate.guest.0, whose host end is a unix socket
// the driver reaches), over which a helper command needs no process
// started in the guest. internal/guestctl uses it when the driver has it
// and the VM answers, and the guest agent's exec otherwise.
type HelperCaller interface {
	// HelperCall sends one vmgate-guest command (its arguments, without
	// the program name, and its standard input) to vm's resident helper
	// and returns the reply: the exit status and exactly what
	// `vmgate-guest ARGS` would print. ErrNoHelperChannel when vm has no
	// such channel; ErrHelperUnavailable when nothing answers on it;
	// ErrHelperLost when the channel failed during the call.
	HelperCall(ctx context.Context, vm string, call HelperCall) (HelperReply, error)
}

// HelperCall is one helper command.
type HelperCall struct {
	Args  []string
	Stdin []byte
	// Timeout, when positive, is how long the caller waits: the helper
	// cancels the command's context then (a run kills its tree).
	Timeout time.Duration
}

// HelperReply is a helper command's exit status and standard output.
type HelperReply struct {
	Exit   int
	Stdout []byte
}

// The helper channel's errors.
var (
	// ErrNoHelperChannel: the VM has no channel to a resident helper (a
	// VM started without the port, a backend that cannot add one).
	ErrNoHelperChannel = errors.New("no resident helper channel")
	// ErrHelperUnavailable: the channel is there, but no resident helper
	// answered on it (not started, or gone). The call was not sent.
	ErrHelperUnavailable = errors.New("resident helper not answering")
	// ErrHelperLost: the channel failed while the call was in flight:
	// the command may have run (do not send it again blindly).
	ErrHelperLost = errors.New("resident helper channel lost during the call")
)

// AsHelperCaller returns d as a HelperCaller when d has the capability.
func AsHelperCaller(d Driver) (HelperCaller, bool) {
	h, ok := d.(HelperCaller)
	return h, ok && CapabilitiesOf(d).HelperChannel
}
