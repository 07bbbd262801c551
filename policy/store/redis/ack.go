package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy/store"
)

// Writes that wait for a replica (the package doc says which and why).
// WAIT counts the writes of the connection it is sent on, so it always
// travels with its write: in the same pipeline as a script, or on a
// transaction's connection after EXEC. A WAIT sent on another connection
// of the pool would see none of them and return at once.

// script runs sc. When the store waits for replicas, WAIT follows it in
// one pipeline (one round trip) and ack says why its write is not known
// to be on a replica: nil when it is, or when the store does not wait.
// The caller decides whether the script wrote anything that matters (a
// reservation refused as full wrote nothing to wait for).
func (s *Store) script(ctx context.Context, sc *goredis.Script, keys []string, args ...any) (cmd *goredis.Cmd, ack error) {
	if s.acks == 0 {
		return sc.Run(ctx, s.client, keys, args...), nil
	}
	cmd, wait := s.scriptWait(ctx, sc, false, keys, args)
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		// Not in this server's script cache yet (a new primary, a restart):
		// the script body once, like Script.Run.
		cmd, wait = s.scriptWait(ctx, sc, true, keys, args)
	}
	return cmd, s.acked(wait)
}

// scriptWait sends sc (by digest, or its body when eval) and WAIT in one
// pipeline.
func (s *Store) scriptWait(ctx context.Context, sc *goredis.Script, eval bool, keys []string, args []any) (cmd, wait *goredis.Cmd) {
	// The pipeline's own error is the first failed command's: cmd and
	// wait carry everything.
	_, _ = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		if eval {
			cmd = sc.Eval(ctx, p, keys, args...)
		} else {
			cmd = sc.EvalSha(ctx, p, keys, args...)
		}
		wait = s.wait(ctx, p)
		return nil
	})
	return cmd, wait
}

// doer sends one command: a client, a pipeline, a transaction.
type doer interface {
	Do(ctx context.Context, args ...any) *goredis.Cmd
}

// wait sends WAIT acks ackTimeout on c.
func (s *Store) wait(ctx context.Context, c doer) *goredis.Cmd {
	return c.Do(ctx, "WAIT", s.acks, s.ackTimeout.Milliseconds())
}

// ackOn waits for a replica to acknowledge the writes made on c's
// connection (a transaction after its EXEC), when the store waits for
// replicas. The error wraps store.ErrUnavailable.
func (s *Store) ackOn(ctx context.Context, c doer) error {
	if s.acks == 0 {
		return nil
	}
	if err := s.acked(s.wait(ctx, c)); err != nil {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return nil
}

// acked is why the writes WAIT followed are not known to be on enough
// replicas: WAIT's own error, or errNotReplicated; nil when they are.
func (s *Store) acked(wait *goredis.Cmd) error {
	n, err := wait.Int64()
	switch {
	case err != nil:
		return fmt.Errorf("wait for a replica: %w", err)
	case n < int64(s.acks):
		return fmt.Errorf("%w within %v (Redis WAIT %d): a write only the primary holds could be lost in a failover, so it does not count; check that a replica is connected and in sync (INFO replication on the primary)",
			errNotReplicated, s.ackTimeout, s.acks)
	}
	return nil
}
