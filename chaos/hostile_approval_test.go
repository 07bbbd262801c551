package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// gatedPolicy parks every command, every file write and all console
// input for an operator.
const gatedPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_agent_exec": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } },
    "vm_file_write": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } },
    "vm_console_write": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } }
  }
}
`

// approvalID is the approval id of a reply that parked its call.
func approvalID(r reply) (string, error) {
	if r.outcome() != "[APPROVAL REQUIRED]" || r.Result == nil {
		return "", fmt.Errorf("the operator's call got %s (%.300s); want [APPROVAL REQUIRED]", r.outcome(), r.Body)
	}
	var sc struct {
		ID string `json:"approval_id"`
	}
	if err := json.Unmarshal(r.Result.Structured, &sc); err != nil || sc.ID == "" {
		return "", fmt.Errorf("no approval_id in %.300s", r.Result.Structured)
	}
	return sc.ID, nil
}

// operate runs the operator's part of c: read the parked call with
// vmgate approvals list and show, check what they print, and decide.
func operate(c hostileCase, cfg, id string) error {
	a := c.Approve
	list, err := runVMGate("approvals", "list", "--config", cfg)
	if err != nil {
		return fmt.Errorf("vmgate approvals list: %v\n%s", err, list)
	}
	show, err := runVMGate("approvals", "show", id, "--config", cfg)
	if err != nil {
		return fmt.Errorf("vmgate approvals show: %v\n%s", err, show)
	}
	if !strings.Contains(list, id) {
		return fmt.Errorf("vmgate approvals list does not list %s:\n%s", id, list)
	}
	for _, want := range a.Sees {
		if !strings.Contains(show, want) {
			return fmt.Errorf("vmgate approvals show %s does not show %q:\n%.3000s", id, want, show)
		}
	}
	for _, want := range a.ListSees {
		if !strings.Contains(list, want) {
			return fmt.Errorf("vmgate approvals list does not show %q:\n%.3000s", want, list)
		}
	}
	for _, never := range a.NeverSees {
		if strings.Contains(list, never) || strings.Contains(show, never) {
			return fmt.Errorf("vmgate approvals printed %q raw:\n%q", never, show)
		}
	}
	if out, err := runVMGate("approvals", a.Decide, id, "--reason", "chaos "+c.Name, "--config", cfg); err != nil {
		return fmt.Errorf("vmgate approvals %s %s: %v\n%s", a.Decide, id, err, out)
	}
	return nil
}

// TestHostileApprovals runs the operator cases of the corpus (approve set)
// against a policy that parks commands and file writes: the operator sees
// every argument the call will run with (hidden characters escaped,
// binary as hex, long values in full with show), and what the agent sends
// after the decision is checked like any case: a retry that differs from
// what the operator saw parks anew, and nothing reaches the guest.
func TestHostileApprovals(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	cases := corpusCases(t, "operator", 5, func(c hostileCase) bool { return c.Approve != nil })
	v1 := labtest.VM(t, vm1)
	sent := plantSentinels(t, v1)
	token := newToken()
	s := writeConfig(t, configOpts{
		grants: []grantSpec{{name: "agent", token: token, policy: gatedPolicy}, {name: "local", policy: gatedPolicy}},
		vms:    []*lab.VM{v1},
	})
	passed, total := 0, 0
	run := func(t *testing.T, transport string, send func(body []byte) (reply, error)) {
		for _, c := range cases {
			if c.Transport != transport && c.Transport != "both" {
				continue
			}
			total++
			err := func() error {
				r, err := send([]byte(c.Approve.Body))
				if err != nil {
					return err
				}
				id, err := approvalID(r)
				if err != nil {
					return err
				}
				if err := operate(c, s.cfg, id); err != nil {
					return err
				}
				body := c.body()
				r, err = send(body)
				if err != nil {
					return err
				}
				return c.check(r, body)
			}()
			if err != nil {
				t.Errorf("%s (%s) over %s: %v", c.file, c.Name, transport, err)
				continue
			}
			passed++
		}
	}

	t.Run("http", func(t *testing.T) {
		p := startServe(t, s.cfg)
		cl := newHTTPClient(p.url, token)
		ctx := context.Background()
		if err := cl.initialize(ctx); err != nil {
			t.Fatal(err)
		}
		run(t, "http", func(body []byte) (reply, error) { return cl.post(ctx, body, nil) })
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})
	t.Run("stdio", func(t *testing.T) {
		sc := openStdio(t, s.cfg, "local")
		n := 0
		run(t, "stdio", func(body []byte) (reply, error) {
			n++
			return stdioExchange(sc, body, 10_000+n, true)
		})
		if err := sc.close(30 * time.Second); err != nil {
			t.Errorf("stdio server: %v", err)
		}
	})

	if msg := sent.intact(t, v1); msg != "" {
		t.Error(msg)
	}
	sent.remove(t, v1)
	if _, err := verifyLog(s.auditLog, ""); err != nil {
		t.Error(err)
	}
	// The audit log keeps redacting what the operator saw in full.
	if out, err := runVMGate("audit", "verify", s.auditLog); err != nil {
		t.Errorf("vmgate audit verify: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(s.auditLog); err != nil || strings.Contains(string(b), "echo innocent") || strings.Contains(string(b), "hello-operator") || strings.Contains(string(b), "innocent-console") {
		t.Errorf("the audit log holds a stdin, env or console text value in clear (%v)", err)
	}
	report.add("hostile approvals", fmt.Sprintf("%d operator cases (stdin, env and content swapped after the approval; hidden escapes, bidi, long tails)", len(cases)),
		fmt.Sprintf("%d of %d as expected; the operator saw every argument; guest sentinels unchanged", passed, total))
}
