package pveemu

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
)

// task is a worker task (PVE::RESTEnvironment::fork_worker, pve-common): it
// runs in the background; the API answers its UPID at once and the outcome
// is only in GET /nodes/{node}/tasks/{upid}/status.
type task struct {
	upid      string
	node      string
	typ       string
	id        string
	user      string
	pid       int
	pstart    int
	starttime int64

	// mu guards the fields below.
	mu         sync.Mutex
	lines      []string
	warnings   int
	exitstatus string // set when the task has ended
	done       bool
	// finished is closed when the task has ended.
	finished chan struct{}
}

// print adds a line to the task log.
func (t *task) print(format string, args ...any) {
	t.mu.Lock()
	t.lines = append(t.lines, fmt.Sprintf(format, args...))
	t.mu.Unlock()
}

// warn is PVE::RESTEnvironment::warn: a "WARN:" line, counted.
func (t *task) warn(format string, args ...any) {
	t.mu.Lock()
	t.lines = append(t.lines, "WARN: "+fmt.Sprintf(format, args...))
	t.warnings++
	t.mu.Unlock()
}

// upidRE is PVE::UPID::decode's pattern (pve-common src/PVE/UPID.pm).
var upidRE = regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$`)

// forkWorker is PVE::RESTEnvironment::fork_worker: it starts run in the
// background and returns the task's UPID (PVE::UPID::encode). The task ends
// with "TASK OK", "TASK WARNINGS: N" or "TASK ERROR: msg" (newlines of msg
// turned into spaces), which read_status gives back as exitstatus.
func (e *Emulator) forkWorker(r *request, typ, id string, run func(t *task) *apiError) string {
	node := scalar(r.params["node"])
	e.mu.Lock()
	e.nextPID++
	t := &task{node: node, typ: typ, id: id, user: r.token.ID, pid: e.nextPID,
		pstart: int(time.Since(processStart) / (10 * time.Millisecond)), starttime: time.Now().Unix(),
		finished: make(chan struct{})}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", t.node, t.pid, t.pstart, t.starttime, t.typ, t.id, t.user)
	e.tasks[t.upid] = t
	e.mu.Unlock()
	e.wg.Go(func() {
		err := run(t)
		t.mu.Lock()
		defer t.mu.Unlock()
		switch {
		case err != nil:
			t.exitstatus = err.taskStatus()
			t.lines = append(t.lines, "TASK ERROR: "+t.exitstatus)
		case t.warnings > 0:
			t.exitstatus = fmt.Sprintf("WARNINGS: %d", t.warnings)
			t.lines = append(t.lines, "TASK "+t.exitstatus)
		default:
			t.exitstatus = "OK"
			t.lines = append(t.lines, "TASK OK")
		}
		t.done = true
		close(t.finished)
	})
	return t.upid
}

// failedWorker is a worker whose first step, loading the VM's config under
// lock_config, fails with err: the method answers its UPID and the task
// ends with err (rollback and delsnapshot, whose handlers do not look at
// the config before forking).
func (e *Emulator) failedWorker(r *request, typ string, err *apiError) string {
	return e.forkWorker(r, typ, scalar(r.params["vmid"]), func(*task) *apiError { return err })
}

// processStart stands in for the host's boot time in pstart.
var processStart = time.Now().Add(-time.Hour)

// lookupTask finds the task of the upid parameter as read_task_status does:
// an unparsable UPID or one without a task log on this node is a
// parameter error; another user's task needs Sys.Audit on the node.
func (e *Emulator) lookupTask(r *request) (*task, *apiError) {
	upid := scalar(r.params["upid"])
	if !upidRE.MatchString(upid) {
		return nil, paramExc(map[string]string{"upid": "unable to parse worker upid"})
	}
	e.mu.Lock()
	t := e.tasks[upid]
	e.mu.Unlock()
	node := scalar(r.params["node"])
	if t == nil || t.node != node {
		return nil, paramExc(map[string]string{"upid": "no such task"})
	}
	// $check_task_user: a token sees its own tasks, a user its own and
	// its tokens'.
	if t.user != r.token.ID && userOf(t.user) != r.token.ID {
		if err := e.check(r.token, "/nodes/"+node, "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// taskStatus is pve-manager PVE/API2/Tasks.pm read_task_status.
func (e *Emulator) taskStatus(r *request) (any, *apiError) {
	t, err := e.lookupTask(r)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart,
		"starttime": t.starttime, "type": t.typ, "id": t.id, "user": t.user, "status": "running"}
	// $convert_token_task: the user and token parts are reported apart.
	if m := tokenFullRE.FindStringSubmatch(t.user); m != nil {
		out["user"], out["tokenid"] = m[1], m[4]
	}
	t.mu.Lock()
	if t.done {
		out["status"] = "stopped"
		out["exitstatus"] = t.exitstatus
	}
	t.mu.Unlock()
	return out, nil
}

// taskLog is Tasks.pm read_task_log: lines as {n, t}, from start (0),
// at most limit (50).
func (e *Emulator) taskLog(r *request) (any, *apiError) {
	t, err := e.lookupTask(r)
	if err != nil {
		return nil, err
	}
	start, limit := intParam(r.params, "start", 0), intParam(r.params, "limit", 50)
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []map[string]any{}
	for i, l := range t.lines {
		if int64(i) < start || int64(len(out)) >= limit {
			continue
		}
		out = append(out, map[string]any{"n": i + 1, "t": strings.TrimRight(l, "\n")})
	}
	return out, nil
}
