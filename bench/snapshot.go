package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
)

// The snapshot rows: what a snapshot of a lab VM (with its memory) costs
// through vmgate serve against the same QMP job sent straight to QEMU
// (9a create, 9b revert), and what snapshot_before adds to a destructive
// call (9c: the same `rm -f` exec, named by the policy's snapshot_before /
// not named). Like the lab rows, each round runs the server, stops it (the
// QMP socket takes one client), then the baselines.

// snapPolicy: an exec whose shell removes /tmp/bench-undo-* gets a snapshot
// first; the snapshot tools are allowed.
const snapPolicy = `{"version":"1","default":"deny","tools":{
  "snapshot_create":{},"snapshot_revert":{},"snapshot_delete":{},"snapshot_list":{},
  "vm_agent_exec":{"snapshot_before":{"retention":"1h","if":[{"path":"args.shell","op":"contains","value":"/tmp/bench-undo-"}]}}}}`

func snapshotRows(ctx context.Context, vmgate string, warmup, pairs int) []*Row {
	create := &Row{ID: "9a", Unit: "ms", What: "snapshot with memory of a lab VM: snapshot_create (MCP stdio, gate, QEMU plugin, QMP job) / snapshot-save job straight on QMP"}
	revert := &Row{ID: "9b", Unit: "ms", What: "revert of a lab VM to it: snapshot_revert through vmgate serve / snapshot-load job straight on QMP"}
	undo := &Row{ID: "9c", Unit: "ms", What: "destructive exec (rm -f of a file): with snapshot_before / the same exec without"}
	rows := []*Row{create, revert, undo}
	fail := func(err error) []*Row { return failRows(rows, pairs, err) }
	if withoutQEMU(rows) {
		return rows
	}
	l, err := startLab(ctx, vmgate, 1)
	defer l.stopLogged()
	if err != nil {
		return fail(err)
	}
	cfg, err := l.writePolicyConfig("snap", snapPolicy)
	if err != nil {
		return fail(err)
	}
	vm1, err := lab.Get(l.stateDir, "vm1")
	if err != nil {
		return fail(err)
	}
	err = Rounds(ctx, warmup, pairs, func(ctx context.Context, i int, counts bool) error {
		gc, gr, with, without, err := l.snapServerRound(ctx, cfg, i, vm1.QMPSocket)
		if err != nil {
			return err
		}
		rc, rr, err := rawSnapshotRound(ctx, vm1.QMPSocket, i)
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		return errors.Join(create.Add(gc, rc), revert.Add(gr, rr), undo.Add(with, without))
	})
	if err != nil {
		return fail(err)
	}
	return rows
}

// writePolicyConfig writes vmgate serve's config for a row, as shipped
// (bbolt, fsync always, the driver as a plugin) with pol as grant local's
// policy; name tells the files of one row from another's.
func (l *labEnv) writePolicyConfig(name, pol string) (string, error) {
	pp := filepath.Join(l.stateDir, "bench-"+name+"-policy.json")
	if err := os.WriteFile(pp, []byte(pol), 0o600); err != nil {
		return "", err
	}
	cfg := "state_dir: " + strconv.Quote(l.stateDir) + "\n" +
		"audit: {fsync: always}\n" +
		"grants: [{name: local, policy: " + strconv.Quote(pp) + "}]\n" +
		"backends: [{name: lab, driver: qemu, settings: {lab: true}}]\n"
	p := filepath.Join(l.stateDir, "bench-"+name+"-vmgate.yaml")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// snapServerRound measures through vmgate serve: create, revert (the
// snapshot is deleted afterwards, untimed), and one exec with and one
// without snapshot_before, in an order that alternates with i. The undo
// snapshot is deleted on QMP (qmpSocket): no grant may delete one.
func (l *labEnv) snapServerRound(ctx context.Context, cfg string, i int, qmpSocket string) (create, revert, with, without float64, err error) {
	p, err := l.serve(ctx, cfg)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.kill()
		}
	}()
	name := "bench-" + strconv.Itoa(i)
	timed := func(tool, args string) (float64, error) {
		t0 := time.Now()
		_, err := p.client.callTool(ctx, tool, args)
		return float64(time.Since(t0).Nanoseconds()) / 1e6, err
	}
	if create, err = timed("snapshot_create", `{"vm":"lab/vm1","name":"`+name+`","memory":true}`); err != nil {
		return 0, 0, 0, 0, err
	}
	if revert, err = timed("snapshot_revert", `{"vm":"lab/vm1","name":"`+name+`"}`); err != nil {
		return 0, 0, 0, 0, err
	}
	if _, err := p.client.callTool(ctx, "snapshot_delete", `{"vm":"lab/vm1","name":"`+name+`"}`); err != nil {
		return 0, 0, 0, 0, err
	}
	withUndo := func() (float64, error) {
		ms, err := timed("vm_agent_exec", `{"vm":"lab/vm1","shell":"touch /tmp/bench-undo-x && rm -f /tmp/bench-undo-x"}`)
		if err != nil {
			return 0, err
		}
		return ms, deleteUndoSnapshots(ctx, p.client, qmpSocket)
	}
	plain := func() (float64, error) {
		return timed("vm_agent_exec", `{"vm":"lab/vm1","shell":"touch /tmp/bench-plain-x && rm -f /tmp/bench-plain-x"}`)
	}
	if i%2 == 0 {
		if with, err = withUndo(); err == nil {
			without, err = plain()
		}
	} else if without, err = plain(); err == nil {
		with, err = withUndo()
	}
	if err != nil {
		return 0, 0, 0, 0, err
	}
	stopped = true
	return create, revert, with, without, p.stop()
}

// deleteUndoSnapshots deletes the undo snapshots the exec left (untimed):
// listed through vmgate, deleted straight on QMP (delvm), since undo
// snapshots are the server's and no grant may delete them.
func deleteUndoSnapshots(ctx context.Context, c *mcpClient, qmpSocket string) error {
	res, err := c.callTool(ctx, "snapshot_list", `{"vm":"lab/vm1"}`)
	if err != nil {
		return err
	}
	var out struct {
		Snapshots []struct {
			Name string `json:"name"`
		} `json:"snapshots"`
	}
	if err := json.Unmarshal(res.StructuredContent, &out); err != nil {
		return err
	}
	var names []string
	for _, s := range out.Snapshots {
		if strings.HasPrefix(s.Name, "vmgate-undo-") {
			names = append(names, s.Name)
		}
	}
	if len(names) != 1 {
		return fmt.Errorf("snapshot_before left %d undo snapshots; want 1", len(names))
	}
	q, err := dialQMP(ctx, qmpSocket)
	if err != nil {
		return err
	}
	defer q.c.Close()
	raw, err := q.run("human-monitor-command", map[string]any{"command-line": "delvm " + names[0]})
	if err != nil {
		return err
	}
	var msg string
	if err := json.Unmarshal(raw, &msg); err != nil || strings.TrimSpace(msg) != "" {
		return fmt.Errorf("delvm %s: %q %v", names[0], msg, err)
	}
	return nil
}

// qmpConn is a bare QMP client: one command at a time, events skipped.
type qmpConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(ctx context.Context, socket string) (*qmpConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	q := &qmpConn{c: c, r: bufio.NewReaderSize(c, 1<<20)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		c.Close()
		return nil, err
	}
	if _, err := q.run("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// run sends one command and returns its "return".
func (q *qmpConn) run(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, err
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s", cmd, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

// job runs a snapshot job and polls query-jobs until it concludes, as
// internal/qmp's StateImage does, on this one connection (the baseline pays
// no connect per command).
func (q *qmpConn) job(ctx context.Context, cmd, id string, args map[string]any) error {
	args["job-id"] = id
	if _, err := q.run(cmd, args); err != nil {
		return err
	}
	var b hypervisor.Backoff
	for {
		raw, err := q.run("query-jobs", nil)
		if err != nil {
			return err
		}
		var jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := json.Unmarshal(raw, &jobs); err != nil {
			return err
		}
		for _, j := range jobs {
			if j.ID != id || j.Status != "concluded" {
				continue
			}
			if _, err := q.run("job-dismiss", map[string]any{"id": id}); err != nil {
				return err
			}
			if j.Error != "" {
				return fmt.Errorf("qmp %s: %s", cmd, j.Error)
			}
			return nil
		}
		if err := b.Sleep(ctx, 0); err != nil {
			return err
		}
	}
}

// rawSnapshotRound takes, loads and deletes a snapshot with QMP jobs on
// the VM's writable qcow2 nodes, as the QEMU driver does; create and load
// are timed.
func rawSnapshotRound(ctx context.Context, socket string, i int) (create, revert float64, err error) {
	q, err := dialQMP(ctx, socket)
	if err != nil {
		return 0, 0, err
	}
	defer q.c.Close()
	raw, err := q.run("query-block", nil)
	if err != nil {
		return 0, 0, err
	}
	var blocks []struct {
		Inserted *struct {
			NodeName string `json:"node-name"`
			Ro       bool   `json:"ro"`
			Drv      string `json:"drv"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return 0, 0, err
	}
	var nodes []string
	for _, b := range blocks {
		if b.Inserted != nil && !b.Inserted.Ro && b.Inserted.Drv == "qcow2" {
			nodes = append(nodes, b.Inserted.NodeName)
		}
	}
	if len(nodes) == 0 {
		return 0, 0, errors.New("qmp: the lab VM has no writable qcow2 disk")
	}
	tag := "raw-" + strconv.Itoa(i)
	timed := func(cmd string, args map[string]any) (float64, error) {
		t0 := time.Now()
		err := q.job(ctx, cmd, cmd+"-"+tag, args)
		return float64(time.Since(t0).Nanoseconds()) / 1e6, err
	}
	if create, err = timed("snapshot-save", map[string]any{"tag": tag, "vmstate": nodes[0], "devices": nodes}); err != nil {
		return 0, 0, err
	}
	if revert, err = timed("snapshot-load", map[string]any{"tag": tag, "vmstate": nodes[0], "devices": nodes}); err != nil {
		return 0, 0, err
	}
	if _, err := timed("snapshot-delete", map[string]any{"tag": tag, "devices": nodes}); err != nil {
		return 0, 0, err
	}
	return create, revert, nil
}
