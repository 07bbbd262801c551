package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// RunContextFD runs command like RunContext, passing fd to QEMU with it
// (SCM_RIGHTS on the unix socket), as QMP's getfd and add-fd want. QEMU
// takes its own copy; the caller keeps fd.
func (m *Monitor) RunContextFD(ctx context.Context, command []byte, fd int) ([]byte, error) {
	return m.run(ctx, command, func(s *session, ctx context.Context, msg []byte) error {
		return s.writeFD(ctx, msg, fd)
	})
}

// writeFD writes msg with fd attached to its first byte.
func (s *session) writeFD(ctx context.Context, msg []byte, fd int) error {
	uc, ok := s.conn.(*net.UnixConn)
	if !ok {
		return errors.New("qmp: passing a file descriptor needs a unix socket")
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		uc.SetWriteDeadline(dl)
		defer uc.SetWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { uc.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	n, _, err := uc.WriteMsgUnix(msg, syscall.UnixRights(fd), nil)
	if err == nil && n < len(msg) {
		_, err = uc.Write(msg[n:])
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("send with fd: %w", err)
	}
	return nil
}
