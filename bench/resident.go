package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The resident group: rows 8 to 8e of issue 30 at the tool, through a
// real `vmgate serve` on one lab VM whose vmgate-guest stays resident
// behind its virtio-serial port, each against plain vm_agent_exec of
// /bin/true (what runs as root through the guest agent) in the same round:
//
//	8   vm_agent_exec /bin/true in a sandboxed session / plain
//	8b  the same as a one-shot sandboxed vm_agent_exec (sandbox: {}) / plain
//	8c  create_session (the policy's sandbox; destroyed untimed) / plain
//	8d  a wait:false command in the session prints a line every 300 ms; the
//	    client polls vm_agent_exec_status from its cursor (since) every
//	    residentPoll; A is the round's p50 of seen minus printed, B the
//	    1 s goal (a constant); the note has p90 and max of every line
//	8e  internal/guestctl's BenchmarkLabRows/row=8e (its test binary):
//	    /bin/true through the agent's exec, per command (`vmgate-guest run`)
//	    / through the agent's exec to the resident helper (`vmgate-guest
//	    call run`), the two roads Proxmox and VirtualBox have; measured
//	    behind the lab's qemu-ga, as the emulators add the same transport
//	    to each side
//
// The A and B calls of rows 8–8c alternate one by one, the order turning
// every call (interleaved), residentExecs of each per round.

// residentExecs is how many calls of each side a round of rows 8–8c takes;
// residentLines the output lines of a row 8d job; residentPoll the pause
// between two status polls of row 8d (an agent polling closely).
const (
	residentExecs = 15
	residentLines = 10
	residentPoll  = 50 * time.Millisecond
)

// residentBench is residentRows' server, session and rows.
type residentBench struct {
	c                          *mcpClient
	vm, session                string
	inSession, oneShot, create *Row
	output                     *Row
	lines                      []float64 // every counted row 8d line, ms
}

// residentRows measures rows 8–8e. Without QEMU the rows are skipped,
// unless VMGATE_REQUIRE_VM is set, which makes them fail.
func residentRows(ctx context.Context, vmgate string, m mainTests, warmup, pairs int) []*Row {
	b := &residentBench{vm: "vm1",
		inSession: &Row{ID: "8", Unit: "ms", What: "resident helper: exec /bin/true through vm_agent_exec in a sandboxed session (own uid, no_new_privs, Landlock, net none, cgroup) / plain vm_agent_exec"},
		oneShot:   &Row{ID: "8b", Unit: "ms", What: "resident helper: exec /bin/true through vm_agent_exec with a one-shot sandbox (sandbox: {}) / plain vm_agent_exec"},
		create:    &Row{ID: "8c", Unit: "ms", What: "resident helper: create_session (the policy's sandbox; destroyed untimed) / plain vm_agent_exec of /bin/true"},
		output:    &Row{ID: "8d", Unit: "ms", What: fmt.Sprintf("resident helper: a running command's output line seen through vm_agent_exec_status (since, polled every %v) after it was printed in the guest, p50 of a round / the 1 s goal", residentPoll)},
	}
	roads := &Row{ID: "8e", Unit: "ms", What: "resident helper, the Proxmox and VirtualBox roads (guestctl level, behind the lab's qemu-ga): /bin/true through the agent's exec, per command (vmgate-guest run) / to the resident helper (vmgate-guest call run)"}
	rows := []*Row{b.inSession, b.oneShot, b.create, b.output}
	if withoutQEMU(append(rows, roads)) {
		return append(rows, roads)
	}
	if err := b.run(ctx, vmgate, warmup, pairs); err != nil {
		failRows(rows, pairs, err)
	}
	if len(b.lines) > 0 {
		slices.Sort(b.lines)
		b.output.Note = fmt.Sprintf("all lines: p90 %.1f ms, max %.1f ms", b.lines[len(b.lines)*9/10], b.lines[len(b.lines)-1])
	}
	roads.Err = roadRow(ctx, m, roads, warmup, pairs)
	return append(rows, roads)
}

// run boots the lab VM, serves it, makes the session rows 8 and 8d use
// and measures the rounds.
func (b *residentBench) run(ctx context.Context, vmgate string, warmup, pairs int) (err error) {
	l, err := startLab(ctx, vmgate, 1)
	defer l.stopLogged()
	if err != nil {
		return err
	}
	cfg, err := l.writeConfig()
	if err != nil {
		return err
	}
	p, err := l.serve(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.stop()) }()
	b.c = p.client
	if b.session, err = createSession(ctx, b.c, b.vm); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, destroySession(ctx, b.c, b.vm, b.session)) }()
	if err := b.checkRoad(ctx); err != nil {
		return err
	}
	return Rounds(ctx, warmup, pairs, b.round)
}

// checkRoad makes sure the rows measure the resident helper over its
// channel, as vm_status reports it, not the per-command fallback.
func (b *residentBench) checkRoad(ctx context.Context) error {
	res, err := b.c.callTool(ctx, "vm_status", `{"vm":"lab/`+b.vm+`"}`)
	if err != nil {
		return err
	}
	return residentRoad(b.vm, res.StructuredContent)
}

// residentRoad checks that a vm_status answer's helper object says the
// resident helper over the virtio-serial port.
func residentRoad(vm string, status json.RawMessage) error {
	var st struct {
		Helper struct {
			Road string `json:"road"`
			Via  string `json:"via"`
		} `json:"helper"`
	}
	if err := json.Unmarshal(status, &st); err != nil {
		return fmt.Errorf("vm_status: %w", err)
	}
	if h := st.Helper; h.Road != "resident" || h.Via != "virtio-serial" {
		return fmt.Errorf("vm_status of %s = %s; want the resident helper over the virtio-serial port as the road", vm, status)
	}
	return nil
}

// round is one round of rows 8–8d.
func (b *residentBench) round(ctx context.Context, _ int, counts bool) error {
	plain := func() (time.Duration, error) { return execTrue(ctx, b.c, b.vm) }
	for _, row := range []struct {
		r *Row
		a func() (time.Duration, error)
	}{
		{b.inSession, func() (time.Duration, error) { return execTrueIn(ctx, b.c, b.vm, b.session) }},
		{b.oneShot, func() (time.Duration, error) { return execTrueArgs(ctx, b.c, b.vm, `,"sandbox":{}`) }},
		{b.create, func() (time.Duration, error) { return timedCreate(ctx, b.c, b.vm) }},
	} {
		ms, err := interleaved(residentExecs, row.a, plain)
		if err != nil {
			return fmt.Errorf("row %s: %w", row.r.ID, err)
		}
		if counts {
			if err := row.r.Add(ms[0], ms[1]); err != nil {
				return err
			}
		}
	}
	lat, err := b.outputLatency(ctx)
	if err != nil || !counts {
		return err
	}
	b.lines = append(b.lines, lat...)
	med, _ := medianSpread(lat)
	return b.output.Add(med, 1000)
}

// createSession makes a session with the policy's sandbox on vm and checks
// that the guest confines it.
func createSession(ctx context.Context, c *mcpClient, vm string) (string, error) {
	res, err := c.callTool(ctx, "create_session", `{"vm":"lab/`+vm+`"}`)
	if err != nil {
		return "", err
	}
	var sess struct {
		Session  string `json:"session"`
		Enforced struct {
			Sandboxed bool `json:"sandboxed"`
			UID       int  `json:"uid"`
			Landlock  struct {
				FS bool `json:"fs"`
			} `json:"landlock"`
		} `json:"enforced"`
	}
	if err := json.Unmarshal(res.StructuredContent, &sess); err != nil {
		return "", fmt.Errorf("create_session: %w", err)
	}
	if e := sess.Enforced; sess.Session == "" || !e.Sandboxed || e.UID == 0 || !e.Landlock.FS {
		return "", fmt.Errorf("create_session on %s = %s; want a session confined by its own uid and Landlock", vm, res.StructuredContent)
	}
	return sess.Session, nil
}

func destroySession(ctx context.Context, c *mcpClient, vm, session string) error {
	_, err := c.callTool(context.WithoutCancel(ctx), "destroy_session", `{"vm":"lab/`+vm+`","session":"`+session+`"}`)
	return err
}

// timedCreate is how long create_session took on vm; the session is
// destroyed after, untimed.
func timedCreate(ctx context.Context, c *mcpClient, vm string) (time.Duration, error) {
	t0 := time.Now()
	s, err := createSession(ctx, c, vm)
	took := time.Since(t0)
	if err != nil {
		return 0, err
	}
	return took, destroySession(ctx, c, vm, s)
}

// guestClock is the guest's uptime minus the host's clock in seconds, from
// the plain vm_agent_exec of `cat /proc/uptime` that bracketed its reading
// most tightly (of 7).
func (b *residentBench) guestClock(ctx context.Context) (float64, error) {
	best, off := time.Duration(math.MaxInt64), 0.0
	for range 7 {
		t1 := time.Now()
		res, err := b.c.callTool(ctx, "vm_agent_exec", `{"vm":"lab/`+b.vm+`","command":["cat","/proc/uptime"]}`)
		rtt := time.Since(t1)
		if err != nil {
			return 0, err
		}
		var out struct {
			Stdout string `json:"stdout"`
		}
		if err := json.Unmarshal(res.StructuredContent, &out); err != nil {
			return 0, fmt.Errorf("vm_agent_exec: %w", err)
		}
		up, err := uptime(out.Stdout)
		if err != nil {
			return 0, err
		}
		if rtt < best {
			best, off = rtt, up-float64(t1.Add(rtt/2).UnixNano())/1e9
		}
	}
	return off, nil
}

// uptime is the first field of a /proc/uptime line, in seconds.
func uptime(line string) (float64, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return 0, fmt.Errorf("uptime: empty line")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("uptime: line %q: %w", line, err)
	}
	return v, nil
}

// outputLatency runs one row 8d job in the session and returns, for each
// line, the time it was seen through vm_agent_exec_status minus the time
// the guest printed it (its uptime on the host's clock: /proc/uptime has
// 10 ms steps), in ms.
func (b *residentBench) outputLatency(ctx context.Context) ([]float64, error) {
	off, err := b.guestClock(ctx)
	if err != nil {
		return nil, err
	}
	shell := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 0.3; cat /proc/uptime; i=$((i+1)); done`, residentLines)
	args, _ := json.Marshal(map[string]any{"vm": "lab/" + b.vm, "session": b.session, "wait": false, "timeout_s": 60, "shell": shell})
	res, err := b.c.callTool(ctx, "vm_agent_exec", string(args))
	if err != nil {
		return nil, err
	}
	var started struct {
		ExecID string `json:"exec_id"`
	}
	if err := json.Unmarshal(res.StructuredContent, &started); err != nil || started.ExecID == "" {
		return nil, fmt.Errorf("vm_agent_exec wait:false = %s; want an exec_id (%v)", res.StructuredContent, err)
	}
	var lat []float64
	var since json.RawMessage
	partial := ""
	for running := true; running; {
		st, err := b.status(ctx, started.ExecID, since)
		if err != nil {
			return nil, err
		}
		seen := float64(time.Now().UnixNano()) / 1e9
		since, running = st.Next, st.State == "running" || st.More
		full := strings.Split(partial+st.Stdout, "\n")
		partial = full[len(full)-1]
		for _, line := range full[:len(full)-1] {
			up, err := uptime(line)
			if err != nil {
				return nil, err
			}
			lat = append(lat, (seen-(up-off))*1000)
		}
		if running {
			time.Sleep(residentPoll)
		}
	}
	if len(lat) != residentLines {
		return nil, fmt.Errorf("row 8d: saw %d lines; want %d", len(lat), residentLines)
	}
	return lat, nil
}

// jobStatus is what row 8d reads of a vm_agent_exec_status answer.
type jobStatus struct {
	State  string          `json:"state"`
	Stdout string          `json:"stdout"`
	Next   json.RawMessage `json:"next"`
	More   bool            `json:"more"`
}

// status reads job id from cursor since (from the start when nil).
func (b *residentBench) status(ctx context.Context, id string, since json.RawMessage) (jobStatus, error) {
	args := `{"vm":"lab/` + b.vm + `","exec_id":"` + id + `"`
	if since != nil {
		args += `,"since":` + string(since)
	}
	res, err := b.c.callTool(ctx, "vm_agent_exec_status", args+"}")
	if err != nil {
		return jobStatus{}, err
	}
	var st jobStatus
	if err := json.Unmarshal(res.StructuredContent, &st); err != nil {
		return jobStatus{}, fmt.Errorf("vm_agent_exec_status: %w", err)
	}
	if st.State == "" || st.Next == nil {
		return jobStatus{}, fmt.Errorf("vm_agent_exec_status = %s; want a job's state and next cursor", res.StructuredContent)
	}
	return st, nil
}

// roadRow fills r from internal/guestctl's BenchmarkLabRows/row=8e, one run
// of its test binary with warmup and pairs rounds (it boots its own lab VM).
func roadRow(ctx context.Context, m mainTests, r *Row, warmup, pairs int) error {
	gc := m.bin("guestctl", "internal/guestctl")
	res, err := gc.Bench(ctx, "^BenchmarkLabRows$/^row=8e$", "1x",
		"-rows.warmup", strconv.Itoa(warmup), "-rows.pairs", strconv.Itoa(pairs))
	if err != nil {
		return err
	}
	const name = "BenchmarkLabRows/row=8e"
	for p := 1; p <= pairs; p++ {
		a, err := res.Metric(name, fmt.Sprintf("p%d-a-ms", p))
		if err != nil {
			return err
		}
		bb, err := res.Metric(name, fmt.Sprintf("p%d-b-ms", p))
		if err != nil {
			return err
		}
		if err := r.Add(a, bb); err != nil {
			return err
		}
	}
	return nil
}
