package hypervisor

import (
	"context"
	"log/slog"
)

// ServeCallSocket serves d on a call socket in dir, accepting peers of uid
// (this process's in production), for the external tests.
func ServeCallSocket(dir string, d Driver, uid int) (stop func() error, err error) {
	cs, err := listenCallSocket(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	cs.uid = uid
	registerServer(cs, d)
	cs.start()
	return cs.Close, nil
}

// DialCallSocket returns the host-side driver name speaking to the call
// socket in dir, and what closes its connections.
func DialCallSocket(ctx context.Context, name, dir string) (Driver, func() error, error) {
	cc, err := dialCallSocket(ctx, dir)
	if err != nil {
		return nil, nil, err
	}
	return newClient(name, cc), cc.Close, nil
}

// CallSocketInvoke makes a raw call on the call socket in dir (methods the
// Driver interface does not reach).
func CallSocketInvoke(ctx context.Context, dir, method string, args, reply any) error {
	cc, err := dialCallSocket(ctx, dir)
	if err != nil {
		return err
	}
	defer cc.Close()
	return cc.Invoke(ctx, method, args, reply)
}

// CallSocketIdle is how many idle connections the host side keeps.
const CallSocketIdle = maxIdleCalls

// WatchAfter is how long a call runs before its connection is watched.
const WatchAfter = watchAfter
