//go:build !linux

package hypervisor

import (
	"errors"
	"net"
)

// callSocketSupported: plugins offer no call socket here (the peer's uid
// cannot be checked), so hosts stay on gRPC.
const callSocketSupported = false

// peerUID cannot tell the peer's uid here.
func peerUID(*net.UnixConn) (int, error) {
	return -1, errors.New("peer credentials are not available on this system")
}
