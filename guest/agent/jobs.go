//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Jobs are runs the resident helper keeps in the background: `job start`
// starts one as run would and answers at once with its id; its stdout and
// stderr go to rings (the last max_output_bytes of each, every byte
// counted), which `job status` reads from a cursor, waiting up to
// --wait-ms for something new; the job's timeout, `job cancel` or its
// session's destroy end its whole tree as run's timeout does.
//
// A job lives in the helper's memory, and its record in <Root>/jobs/<id>.json
// (0600, in a 0700 directory): written when it starts and when it ends,
// the end's with the last recordTail bytes of each stream. A host that
// restarts finds its jobs through the helper. A helper that restarts
// (killed, upgraded) finds the records: an ended job answers as before,
// from its record; a job that was running when the helper ended is
// JobLost, its processes ended (they die with the helper, Pdeathsig; the
// new helper kills what is left of its tree by its run marker and cgroup),
// its output that of its start record (none) — a running job's output is
// only in the helper's memory. Ended jobs are kept jobKeep, then forgotten.
const (
	jobKeep         = time.Hour
	maxJobs         = 1024 // records kept, running or ended
	maxRunningJobs  = 256
	recordTail      = 64 << 10
	jobRecordSuffix = ".json"
)

// jobTable is the resident helper's jobs. mu guards byID; each job guards
// its own state.
type jobTable struct {
	a    *Agent
	dir  string
	life context.Context // the helper's: when it ends, every job is ended

	mu   sync.Mutex
	byID map[string]*job
}

// job is one background run. Fields above mu are set before the job is
// shared and never change.
type job struct {
	id, session      string
	runID, runCgroup string
	pid              int
	started          time.Time // for its duration
	// startedAtMS is the process's start as list_processes shows it and a
	// kill checks it (startMS): what the host passes back with the pid.
	startedAtMS    int64
	stdout, stderr *ring
	cancel         context.CancelFunc
	done           chan struct{} // closed once the job has ended and its record is written
	last           atomic.Int32  // the stream written last: 1 stdout, 2 stderr

	mu  sync.Mutex
	end wire.JobStatus // State, exit fields, EndedAt, Canceled, Note
}

// jobRecord is a job's file.
type jobRecord struct {
	Status     wire.JobStatus `json:"status"`
	RunID      string         `json:"run_id"`
	RunCgroup  string         `json:"run_cgroup,omitempty"`
	StdoutTail []byte         `json:"stdout_tail,omitempty"`
	StderrTail []byte         `json:"stderr_tail,omitempty"`
}

func newJobTable(a *Agent, life context.Context) *jobTable {
	return &jobTable{a: a, dir: filepath.Join(a.cfg.Root, "jobs"), life: life, byID: map[string]*job{}}
}

// start starts req as a job.
func (t *jobTable) start(req wire.RunRequest) (wire.JobStarted, error) {
	t.mu.Lock()
	n, running := len(t.byID), t.runningLocked()
	t.mu.Unlock()
	if running >= maxRunningJobs {
		return wire.JobStarted{}, refused("", "job start: %d jobs are running; at most %d", running, maxRunningJobs)
	}
	if n >= maxJobs {
		t.expire(time.Now(), true)
	}
	end := func() {}
	var own *meta
	if req.Sandbox != nil {
		if req.Session != "" {
			return wire.JobStarted{}, invalidf("job start: sandbox and session are exclusive (a session has its own sandbox)")
		}
		if err := validateRun(req); err != nil {
			return wire.JobStarted{}, err
		}
		var err error
		if req, own, end, err = t.a.oneShotSession(t.life, req); err != nil {
			return wire.JobStarted{}, fmt.Errorf("job start: %w", err)
		}
	}
	j := &job{id: randomHex(12), session: req.Session, done: make(chan struct{})}
	j.end.State = wire.JobRunning
	size := outputCap(req)
	j.stdout = newRing(size, func() { j.last.Store(1) })
	j.stderr = newRing(size, func() { j.last.Store(2) })
	p, err := t.a.startRun(req, own, j.stdout, j.stderr)
	if err != nil {
		end()
		return wire.JobStarted{}, fmt.Errorf("job start: %w", err)
	}
	j.pid, j.runID, j.runCgroup, j.started = p.cmd.Process.Pid, p.r.runID, p.r.runCgroup, p.r.startedAt
	j.startedAtMS = t.a.processStartMS(j.pid, j.started)
	ctx, cancel := context.WithCancel(t.life)
	j.cancel = cancel
	t.mu.Lock()
	t.byID[j.id] = j
	t.mu.Unlock()
	t.persist(j)
	go func() {
		defer cancel()
		res, err := t.a.wait(ctx, p.cmd, p.r, p.timeout)
		p.r.close()
		j.finish(res, err, ctx.Err() != nil, t.life.Err() != nil)
		end() // a one-shot sandbox's session, with whatever the job left
		t.persist(j)
		close(j.done)
	}()
	return wire.JobStarted{ID: j.id, PID: j.pid, StartedAt: j.startedAtMS}, nil
}

// processStartMS is pid's start time in ms as /proc gives it (startMS),
// or fallback's when /proc does not say. The job's process cannot have
// been reaped yet (its wait begins after this), so pid is still its.
func (a *Agent) processStartMS(pid int, fallback time.Time) int64 {
	st, err := a.proc.stat(pid)
	if err != nil {
		return fallback.UnixMilli()
	}
	btime, err := a.proc.bootTime()
	if err != nil {
		return fallback.UnixMilli()
	}
	return startMS(btime, st.StartTime)
}

func (t *jobTable) runningLocked() int {
	n := 0
	for _, j := range t.byID {
		if j.running() {
			n++
		}
	}
	return n
}

func (j *job) running() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.end.State == wire.JobRunning
}

// finish records how the job ended: ended when its context ended (a
// cancel, a destroy, or stopping when the helper stopped), not its timeout.
func (j *job) finish(res wire.RunResult, err error, ended, stopping bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.end.State, j.end.EndedAt = wire.JobExited, time.Now().UnixMilli()
	j.end.ExitCode, j.end.Signal, j.end.Killed, j.end.DurationMS = res.ExitCode, res.Signal, res.Killed, res.DurationMS
	j.end.TimedOut = res.TimedOut && !ended
	if ended && stopping && !j.end.Canceled {
		j.end.Canceled, j.end.Note = true, "the resident helper stopped"
	}
	if err != nil {
		j.end.Note = strings.TrimSpace(j.end.Note + " " + err.Error())
	}
}

func (t *jobTable) get(id string) (*job, error) {
	if err := wire.ValidateJobID(id); err != nil {
		return nil, invalidf("job: %v", err)
	}
	t.mu.Lock()
	j, ok := t.byID[id]
	t.mu.Unlock()
	if !ok {
		return nil, notFoundf("job: unknown job %s (ended jobs are kept %v)", id, jobKeep)
	}
	return j, nil
}

// statusArgs are a status call's cursors and bounds.
type statusArgs struct {
	stdoutSince, stderrSince int64
	maxBytes                 int
	wait                     time.Duration
}

// status answers from the cursors, first waiting up to wait for output
// past them or the job's end.
func (t *jobTable) status(ctx context.Context, id string, s statusArgs) (wire.JobStatus, error) {
	j, err := t.get(id)
	if err != nil {
		return wire.JobStatus{}, err
	}
	if s.wait > 0 {
		outc, errc := j.stdout.wait(), j.stderr.wait()
		if j.running() && j.stdout.counts().Total <= s.stdoutSince && j.stderr.counts().Total <= s.stderrSince {
			timer := time.NewTimer(s.wait)
			select {
			case <-outc:
			case <-errc:
			case <-j.done:
			case <-timer.C:
			case <-ctx.Done():
			}
			timer.Stop()
		}
	}
	st := j.status()
	st.Stdout, st.Stderr = j.stdout.read(s.stdoutSince, s.maxBytes), j.stderr.read(s.stderrSince, s.maxBytes)
	return st, nil
}

// status is the job's state without output data (but with its counts).
func (j *job) status() wire.JobStatus {
	j.mu.Lock()
	st := j.end
	j.mu.Unlock()
	st.ID, st.Session, st.PID, st.StartedAt = j.id, j.session, j.pid, j.startedAtMS
	if st.State == wire.JobRunning {
		st.DurationMS = time.Since(j.started).Milliseconds()
	}
	st.Stdout, st.Stderr = j.stdout.counts(), j.stderr.counts()
	if j.last.Load() == 2 {
		st.LastLine = j.stderr.lastLine()
	} else {
		st.LastLine = j.stdout.lastLine()
	}
	return st
}

// cancel ends a running job's tree and waits until it has ended.
func (t *jobTable) cancel(ctx context.Context, id, why string) (wire.JobStatus, error) {
	j, err := t.get(id)
	if err != nil {
		return wire.JobStatus{}, err
	}
	j.endBy(why)
	select {
	case <-j.done:
	case <-ctx.Done():
		return wire.JobStatus{}, fmt.Errorf("job cancel: %w", ctx.Err())
	}
	return j.status(), nil
}

// endBy cancels a running job, noting why.
func (j *job) endBy(why string) {
	j.mu.Lock()
	if j.end.State == wire.JobRunning {
		j.end.Canceled, j.end.Note = true, why
	}
	j.mu.Unlock()
	if j.cancel != nil {
		j.cancel()
	}
}

// endSession ends the jobs of session id, which is being destroyed,
// saying why, and waits (bounded by ctx) until they have ended; it
// returns how many it ended. The destroy then kills whatever of the
// session is left.
func (t *jobTable) endSession(ctx context.Context, id string) int {
	t.mu.Lock()
	var js []*job
	for _, j := range t.byID {
		if j.session == id {
			js = append(js, j)
		}
	}
	t.mu.Unlock()
	for _, j := range js {
		j.endBy("its session was destroyed")
	}
	for _, j := range js {
		select {
		case <-j.done:
		case <-ctx.Done():
			return len(js)
		}
	}
	return len(js)
}

// list is every job's status, oldest first, without data.
func (t *jobTable) list() []wire.JobStatus {
	t.mu.Lock()
	js := make([]*job, 0, len(t.byID))
	for _, j := range t.byID {
		js = append(js, j)
	}
	t.mu.Unlock()
	sort.Slice(js, func(a, b int) bool { return js[a].started.Before(js[b].started) })
	out := make([]wire.JobStatus, len(js))
	for i, j := range js {
		out[i] = j.status()
	}
	return out
}

// expire forgets ended jobs past jobKeep (all ended ones beyond maxJobs/2
// when full), with their records.
func (t *jobTable) expire(now time.Time, full bool) {
	t.mu.Lock()
	var ended []*job
	for _, j := range t.byID {
		if !j.running() {
			ended = append(ended, j)
		}
	}
	sort.Slice(ended, func(a, b int) bool { return ended[a].started.Before(ended[b].started) })
	for i, j := range ended {
		j.mu.Lock()
		old := now.Sub(time.UnixMilli(j.end.EndedAt)) > jobKeep
		j.mu.Unlock()
		if old || full && i < len(ended)-maxJobs/2 {
			delete(t.byID, j.id)
			_ = os.Remove(filepath.Join(t.dir, j.id+jobRecordSuffix))
		}
	}
	t.mu.Unlock()
}

// persist writes the job's record (temporary file, then rename).
func (t *jobTable) persist(j *job) {
	rec := jobRecord{Status: j.status(), RunID: j.runID, RunCgroup: j.runCgroup}
	if rec.Status.State != wire.JobRunning {
		rec.StdoutTail, rec.StderrTail = j.stdout.tail(recordTail), j.stderr.tail(recordTail)
	}
	if err := t.write(j.id, rec); err != nil {
		t.a.cfg.Logger.Warn("job: writing its record", "job", j.id, "err", err)
	}
}

func (t *jobTable) write(id string, rec jobRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	// Not synced: a record is for a helper that restarts, not for a
	// guest that loses power, and job start waits for its record.
	return replaceOwnFile(filepath.Join(t.dir, id+jobRecordSuffix), filepath.Join(t.dir, "."+id+".tmp"), b, 0o600, false)
}

// recover loads the records a previous helper left: ended jobs as they
// were, running ones as JobLost, what is left of their trees killed.
func (t *jobTable) recover(ctx context.Context) {
	ents, err := os.ReadDir(t.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.a.cfg.Logger.Warn("job: reading the records", "err", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), jobRecordSuffix)
		if !ok || wire.ValidateJobID(id) != nil {
			continue
		}
		j, err := t.load(ctx, id)
		if err != nil {
			t.a.cfg.Logger.Warn("job: a record that does not load", "job", id, "err", err)
			continue
		}
		t.mu.Lock()
		t.byID[id] = j
		t.mu.Unlock()
	}
	t.expire(time.Now(), false)
}

// load reads one record; a job that was running is ended and lost.
func (t *jobTable) load(ctx context.Context, id string) (*job, error) {
	b, err := os.ReadFile(filepath.Join(t.dir, id+jobRecordSuffix))
	if err != nil {
		return nil, err
	}
	var rec jobRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, err
	}
	st := rec.Status
	j := &job{id: id, session: st.Session, runID: rec.RunID, runCgroup: rec.RunCgroup, pid: st.PID,
		started: time.UnixMilli(st.StartedAt), startedAtMS: st.StartedAt, done: make(chan struct{})}
	j.stdout = ringFromTail(st.Stdout.Total, rec.StdoutTail)
	j.stderr = ringFromTail(st.Stderr.Total, rec.StderrTail)
	close(j.done)
	j.end = wire.JobStatus{State: st.State, EndedAt: st.EndedAt, ExitCode: st.ExitCode, Signal: st.Signal,
		TimedOut: st.TimedOut, Killed: st.Killed, DurationMS: st.DurationMS, Canceled: st.Canceled, Note: st.Note}
	if st.State == wire.JobRunning {
		// Its run marker and cgroup are the job's alone. Its pid is only
		// while the process that has it started when the job's did: the
		// helper may have ended long ago (a guest that rebooted keeps the
		// records), and a pid, or a process group of that number, may be
		// any process's now.
		tr := tree{cgroup: rec.RunCgroup, markerKey: RunEnv, markerVal: rec.RunID}
		if st.PID > 1 && t.a.processStartMS(st.PID, time.Time{}) == st.StartedAt {
			tr.pgid, tr.root = st.PID, st.PID
		}
		killed, _, kerr := t.a.killUntilGone(ctx, tr, 0, killTimeout)
		j.end.State, j.end.EndedAt, j.end.ExitCode, j.end.Killed = wire.JobLost, time.Now().UnixMilli(), -1, killed
		j.end.Note = "the resident helper ended while this job ran; the job ended with it and its output is lost"
		if kerr != nil {
			j.end.Note += fmt.Sprintf(" (what was left of it survived: %v)", kerr)
		}
		t.persist(j)
	}
	return j, nil
}

// ringFromTail is a ring holding tail, the end of a stream of total
// bytes (one larger than tail: never written again, it keeps the layout
// of a ring that has not wrapped, tail in order).
func ringFromTail(total int64, tail []byte) *ring {
	r := newRing(len(tail)+1, nil)
	r.buf, r.total = bytes.Clone(tail), max64(total, int64(len(tail)))
	return r
}
