//go:build linux

package agent

import (
	"context"
	"io"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// jobCommand runs `job start|status|list|cancel`, which only the resident
// helper serves.
func (a *Agent) jobCommand(ctx context.Context, args []string, stdin io.Reader) (any, error) {
	if len(args) == 0 {
		return nil, invalidf("usage: vmgate-guest job start|status|list|cancel|end-session")
	}
	if a.res == nil {
		return nil, refused(wire.ReasonNotResident, "job %s: jobs need the resident helper (vmgate-guest serve); this is a process per command", args[0])
	}
	jobs := a.res.jobs
	switch sub, rest := args[0], args[1:]; sub {
	case "start":
		if err := parseFlags(newFlags("job start"), rest); err != nil {
			return nil, err
		}
		req, err := readRunRequest("job start", stdin)
		if err != nil {
			return nil, err
		}
		return jobs.start(req)
	case "status":
		fs := newFlags("job status")
		id := fs.String("id", "", "job id")
		var s statusArgs
		fs.Int64Var(&s.stdoutSince, "stdout-since", 0, "stdout cursor (bytes)")
		fs.Int64Var(&s.stderrSince, "stderr-since", 0, "stderr cursor (bytes)")
		fs.IntVar(&s.maxBytes, "max-bytes", wire.DefaultJobReadBytes, "most bytes of each stream")
		waitMS := fs.Int64("wait-ms", 0, "wait this long for output past the cursors or the end")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if s.stdoutSince < 0 || s.stderrSince < 0 {
			return nil, invalidf("job status: negative cursor")
		}
		if s.maxBytes < 0 || s.maxBytes > wire.MaxFileReadBytes {
			return nil, invalidf("job status: --max-bytes %d: want 0..%d", s.maxBytes, wire.MaxFileReadBytes)
		}
		if *waitMS < 0 || *waitMS > wire.MaxJobWaitMS {
			return nil, invalidf("job status: --wait-ms %d: want 0..%d", *waitMS, wire.MaxJobWaitMS)
		}
		s.wait = time.Duration(*waitMS) * time.Millisecond
		return jobs.status(ctx, *id, s)
	case "list":
		if err := parseFlags(newFlags("job list"), rest); err != nil {
			return nil, err
		}
		return jobs.list(), nil
	case "cancel":
		fs := newFlags("job cancel")
		id := fs.String("id", "", "job id")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return jobs.cancel(ctx, *id, "canceled")
	case "end-session":
		// What a session's destroy run per command asks of the resident
		// helper before it kills (endSessionJobs): its jobs end, and so
		// does its confined thread (thread.go), whose runs that destroy
		// kills, before it removes the session's files.
		fs := newFlags("job end-session")
		id := fs.String("session", "", "session id")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if err := wire.ValidateSessionID(*id); err != nil {
			return nil, invalidf("job end-session: %v", err)
		}
		n := jobs.endSession(ctx, *id)
		a.res.threads.end(*id)
		return map[string]int{"ended": n}, nil
	}
	return nil, invalidf("unknown job command %q", args[0])
}

// jobsEndWait bounds how long a session's destroy waits for its jobs to end
// (each job's own cancel ends its tree within the agent's grace).
const jobsEndWait = 10 * time.Second

// endSessionJobs ends session id's jobs before its destroy kills: in the
// resident helper its own, in a process per command those of the resident
// helper, if one runs, through its socket (best effort: without it there
// are no jobs, and the destroy's kill ends any job's processes anyway).
func (a *Agent) endSessionJobs(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, jobsEndWait)
	defer cancel()
	if a.res != nil {
		a.res.jobs.endSession(ctx, id)
		return
	}
	if err := callResident(ctx, a.cfg.Root, []string{"job", "end-session", "--session", id}); err != nil {
		a.cfg.Logger.Debug("session destroy: ending the resident helper's jobs", "session", id, "err", err)
	}
}
