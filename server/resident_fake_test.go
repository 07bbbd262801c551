package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// fakeResident is fakeGuest's resident helper, reached as guestctl
// reaches it through the agent's exec (`vmgate-guest call ...`): started
// by `serve --detach` unless noServe; its jobs' output is what the test
// writes (emit) and they end when the test ends them (end).
type fakeResident struct {
	running bool
	noServe bool // serve fails: the VM has no resident helper
	// statusFails: job status fails, as a helper that cannot answer does.
	statusFails bool
	listFails   bool // job list fails likewise
	jobs        map[string]*fakeJob
	started     []wire.RunRequest // every job start's request
}

type fakeJob struct {
	id      string
	req     wire.RunRequest
	stdout  []byte
	state   string
	exit    int
	note    string
	changed chan struct{} // closed (and replaced) at each emit and at the end
}

func newJobID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// residentLocked answers `vmgate-guest call ARGS` and `serve --detach`.
func (g *fakeGuest) residentLocked(vm string, req hypervisor.ExecRequest) hypervisor.ExecResult {
	r := &g.res
	if req.Argv[1] == "serve" {
		if r.noServe {
			return replyErr(wire.CodeFailed, "", "serve: this guest cannot run the resident helper (test)")
		}
		r.running = true
		return reply(wire.Serving{PID: 4242})
	}
	if !r.running {
		b, _ := json.Marshal(wire.Reply{Error: &wire.Error{Code: wire.CodeFailed, Reason: wire.ReasonNoHelper, Message: "no resident helper"}})
		return hypervisor.ExecResult{Exited: true, ExitCode: wire.ExitNoHelper, Stdout: b}
	}
	args := req.Argv[2:]
	switch {
	case len(args) == 1 && args[0] == "hello":
		return reply(wire.Hello{Proto: wire.Proto, Version: "test", GOOS: "linux", GOARCH: "amd64", SHA256: fakeBuildSum(), PID: 4242, Resident: true, Jobs: len(r.jobs)})
	case len(args) > 1 && args[0] == "job":
		return g.jobLocked(args[1], args, req.Stdin)
	}
	inner := req
	inner.Argv = append([]string{guestctl.GuestPath}, args...)
	return g.answerLocked(vm, inner)
}

func (g *fakeGuest) jobLocked(sub string, args []string, stdin []byte) hypervisor.ExecResult {
	r := &g.res
	switch sub {
	case "start":
		var rr wire.RunRequest
		if err := json.Unmarshal(stdin, &rr); err != nil {
			return replyErr(wire.CodeInvalid, "", err.Error())
		}
		if r.jobs == nil {
			r.jobs = map[string]*fakeJob{}
		}
		j := &fakeJob{id: newJobID(), req: rr, state: wire.JobRunning, changed: make(chan struct{})}
		if rr.Session != "" {
			g.cwds = append(g.cwds, "job:"+rr.Session)
		}
		r.jobs[j.id], r.started = j, append(r.started, rr)
		return reply(wire.JobStarted{ID: j.id, PID: 500 + len(r.jobs), StartedAt: 1767323045000})
	case "status":
		if r.statusFails {
			return replyErr(wire.CodeFailed, "", "job status: failed (test)")
		}
		j := r.jobs[flag(args, "--id")]
		if j == nil {
			return replyErr(wire.CodeNotFound, "", "job status: unknown job")
		}
		return reply(j.status(flag(args, "--stdout-since")))
	case "list":
		if r.listFails {
			return replyErr(wire.CodeFailed, "", "job list: failed (test)")
		}
		var out []wire.JobStatus
		for _, j := range r.jobs {
			st := j.status("0")
			st.Stdout, st.Stderr = wire.JobOutput{}, wire.JobOutput{}
			out = append(out, st)
		}
		return reply(out)
	case "cancel":
		j := r.jobs[flag(args, "--id")]
		if j == nil {
			return replyErr(wire.CodeNotFound, "", "job cancel: unknown job")
		}
		j.finish(-1)
		return reply(j.status("0"))
	}
	return replyErr(wire.CodeInvalid, "", "unknown job command")
}

func (j *fakeJob) status(since string) wire.JobStatus {
	from, _ := strconv.ParseInt(since, 10, 64)
	from = min(from, int64(len(j.stdout)))
	st := wire.JobStatus{ID: j.id, Session: j.req.Session, PID: 7, State: j.state, ExitCode: j.exit, Note: j.note,
		Stdout: wire.JobOutput{Data: j.stdout[from:], Offset: from, Next: int64(len(j.stdout)), Total: int64(len(j.stdout))}}
	if lines := strings.Split(strings.TrimSpace(string(j.stdout)), "\n"); len(lines) > 0 {
		st.LastLine = lines[len(lines)-1]
	}
	return st
}

func (j *fakeJob) finish(exit int) {
	if j.state == wire.JobRunning {
		j.state, j.exit = wire.JobExited, exit
		close(j.changed)
		j.changed = make(chan struct{})
	}
}

// emit writes a line to job id's stdout.
func (g *fakeGuest) emit(id, line string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	j := g.res.jobs[id]
	j.stdout = append(j.stdout, line+"\n"...)
	close(j.changed)
	j.changed = make(chan struct{})
}

// end ends job id with exit.
func (g *fakeGuest) end(id string, exit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.res.jobs[id].finish(exit)
}

// job returns the only job, or the one whose request's session is session.
func (g *fakeGuest) job(session string) (id string, req wire.RunRequest, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, j := range g.res.jobs {
		if session == "" || j.req.Session == session {
			return id, j.req, true
		}
	}
	return "", wire.RunRequest{}, false
}

// waitForJob holds a `job status --wait-ms` of a running job with nothing
// past its cursor until the job writes or ends (as the helper does), or
// the wait is over.
func (g *fakeGuest) waitForJob(ctx context.Context, argv []string) {
	if len(argv) < 4 || !slices.Equal(argv[1:4], []string{"call", "job", "status"}) || flag(argv, "--wait-ms") == "" {
		return
	}
	ms, _ := strconv.Atoi(flag(argv, "--wait-ms"))
	since, _ := strconv.Atoi(flag(argv, "--stdout-since"))
	g.mu.Lock()
	j := g.res.jobs[flag(argv, "--id")]
	if j == nil || j.state != wire.JobRunning || len(j.stdout) > since || g.res.statusFails {
		g.mu.Unlock()
		return
	}
	ch := j.changed
	g.mu.Unlock()
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}
