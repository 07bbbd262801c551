package chaos

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// hostileDir is the corpus, at the repository root.
const hostileDir = "../testdata/hostile"

// hostilePolicy: read-only tools, argv commands that run echo and nothing
// that could run a shell, not in /root (the rule cwd tricks walked past),
// every destructive tool denied or guarded;
// create_session only with a sandbox argument, within a tight ceiling (so
// a looser ask is refused by the sandbox check, naming what was too loose).
const hostilePolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_status": {},
    "list_processes": {},
    "list_sessions": {},
    "vm_agent_exec": {
      "require": [ { "path": "args.command", "op": "contains", "value": "echo" } ],
      "deny_if": [
        { "path": "args.shell", "op": "exists" },
        { "path": "args.command", "op": "contains", "value": "sh" },
        { "path": "args.command", "op": "contains", "value": "/bin/sh" },
        { "path": "args.command", "op": "contains", "value": "busybox" },
        { "path": "args.command", "op": "contains", "value": "touch" },
        { "path": "args.cwd", "op": "regex", "value": "^/root" }
      ]
    },
    "vm_agent_exec_status": {},
    "kill_process": {},
    "destroy_session": {},
    "create_session": {
      "require": [ { "path": "args.sandbox", "op": "exists" } ],
      "sandbox": { "net": "none", "user": "session", "fs": { "read": ["/srv"], "write": ["/srv/out"] } }
    },
    "vm_file_read": {},
    "vm_file_write": { "action": "deny", "reason": "file writes are off for hostile input" },
    "vm_power": { "action": "deny", "reason": "power is off for hostile input" },
    "vm_create": {
      "limits": [ { "counter": "vms", "kind": "quota", "max": 1, "scope": "grant" } ],
      "lease": { "default_ttl": "1m", "max_ttl": "5m" }
    },
    "vm_delete": {}
  }
}
`

// hostileCase is one file of the corpus.
type hostileCase struct {
	Name       string              `json:"name"`
	Transport  string              `json:"transport"` // http, stdio or both
	Headers    map[string][]string `json:"headers"`   // HTTP: replace these headers ([] removes one); $TOKEN is the grant's token
	Query      string              `json:"query"`     // HTTP: query string; $TOKEN as above
	Host       string              `json:"host"`      // HTTP: Host header
	Body       *string             `json:"body"`      // the raw message (may be invalid JSON)
	BodyBase64 string              `json:"body_base64"`
	Generate   string              `json:"generate"`    // 20mb-stdin, 20mb-no-id, 40mb: made by the test
	Expect     string              `json:"expect"`      // a tag, "ok", "rpc:<code>", "http:<status>" or "silent"
	ExpectHTTP string              `json:"expect_http"` // overrides expect over HTTP
	ExpectAlt  []string            `json:"expect_alt"`
	SameID     bool                `json:"same_id"` // a successful reply carries the request's id byte for byte
	Stdout     *string             `json:"stdout"`  // "ok" exec: the exact stdout
	Says       []string            `json:"says"`    // a tool result's text holds each of these
	// Approve, when set, makes the case an operator's: its call parks, the
	// operator reads it with vmgate approvals and decides, then body is
	// sent (TestHostileApprovals; TestHostile leaves these cases out).
	Approve *approveStep `json:"approve"`
	// Files, when set, makes the case a file case: TestHostileFiles runs
	// it against filesPolicy over the planted file fixture (TestHostile
	// leaves these cases out) and checks the guest file it names afterwards.
	Files *filesCheck `json:"files"`
	file  string
}

// approveStep is what an operator is asked to approve, what they must and
// must not see, and what they decide.
type approveStep struct {
	Body      string   `json:"body"`       // a call the gated policy parks
	Sees      []string `json:"sees"`       // text `vmgate approvals show ID` prints
	ListSees  []string `json:"list_sees"`  // text `vmgate approvals list` prints
	NeverSees []string `json:"never_sees"` // text neither prints (raw control characters)
	Decide    string   `json:"decide"`     // grant or deny
}

func loadCorpus(t *testing.T) []hostileCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(hostileDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []hostileCase
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := parseCase(filepath.Base(f), b)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, c)
	}
	return cases
}

// generators are the bodies the test makes itself (see body).
var generators = []string{"20mb-stdin", "20mb-no-id", "40mb"}

// parseCase decodes one corpus file strictly: unknown fields, a missing
// name, expect or transport, a body_base64 that does not decode, an unknown
// generator, or not exactly one of body, body_base64 and generate are errors.
func parseCase(file string, b []byte) (hostileCase, error) {
	var c hostileCase
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return hostileCase{}, fmt.Errorf("%s: %w", file, err)
	}
	c.file = file
	sources := 0
	for _, set := range []bool{c.Body != nil, c.BodyBase64 != "", c.Generate != ""} {
		if set {
			sources++
		}
	}
	if c.Name == "" || c.Expect == "" || !slices.Contains([]string{"http", "stdio", "both"}, c.Transport) || sources != 1 {
		return hostileCase{}, fmt.Errorf("%s: want name, expect, transport http|stdio|both and exactly one of body, body_base64, generate", file)
	}
	if _, err := base64.StdEncoding.DecodeString(c.BodyBase64); err != nil {
		return hostileCase{}, fmt.Errorf("%s: body_base64: %w", file, err)
	}
	if c.Generate != "" && !slices.Contains(generators, c.Generate) {
		return hostileCase{}, fmt.Errorf("%s: unknown generator %q; want one of %v", file, c.Generate, generators)
	}
	if a := c.Approve; a != nil && (a.Body == "" || len(a.Sees) == 0 || a.Decide != "grant" && a.Decide != "deny") {
		return hostileCase{}, fmt.Errorf("%s: approve needs a body, what the operator sees and a decision grant|deny", file)
	}
	return c, nil
}

// TestHostileCorpus checks the corpus itself, without a VM: every file
// parses, and a case that compares reply ids sends a readable one.
func TestHostileCorpus(t *testing.T) {
	cases := loadCorpus(t)
	if len(cases) < 150 {
		t.Fatalf("the corpus has %d cases; want at least 150", len(cases))
	}
	for _, c := range cases {
		if !c.SameID || c.Generate != "" {
			continue
		}
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(c.body(), &req); err != nil || req.ID == nil {
			t.Errorf("%s: same_id on a body without a readable id (%v)", c.file, err)
		}
	}
}

func TestParseCaseRejectsBadCorpusFiles(t *testing.T) {
	tests := []struct {
		name, file string
	}{
		{"no source", `{"name":"n","transport":"http","expect":"ok"}`},
		{"body and base64", `{"name":"n","transport":"http","expect":"ok","body":"{}","body_base64":"e30="}`},
		{"body and generate", `{"name":"n","transport":"http","expect":"ok","body":"{}","generate":"40mb"}`},
		{"all three sources", `{"name":"n","transport":"http","expect":"ok","body":"{}","body_base64":"e30=","generate":"40mb"}`},
		{"bad base64", `{"name":"n","transport":"http","expect":"ok","body_base64":"e30"}`},
		{"unknown generator", `{"name":"n","transport":"http","expect":"ok","generate":"1tb"}`},
		{"unknown field", `{"name":"n","transport":"http","expect":"ok","body":"{}","expext":"ok"}`},
		{"bad transport", `{"name":"n","transport":"smtp","expect":"ok","body":"{}"}`},
		{"no name", `{"transport":"http","expect":"ok","body":"{}"}`},
		{"no expect", `{"name":"n","transport":"http","body":"{}"}`},
		{"not JSON", `{"name":`},
	}
	for _, tt := range tests {
		if c, err := parseCase(tt.name, []byte(tt.file)); err == nil {
			t.Errorf("parseCase(%s) = %+v, nil; want an error", tt.name, c)
		}
	}
	good := []string{
		`{"name":"n","transport":"http","expect":"ok","body":""}`,
		`{"name":"n","transport":"stdio","expect":"ok","body_base64":"e30="}`,
		`{"name":"n","transport":"both","expect":"ok","generate":"40mb"}`,
	}
	for _, f := range good {
		if _, err := parseCase("good", []byte(f)); err != nil {
			t.Errorf("parseCase(%s) = %v; want nil", f, err)
		}
	}
}

// body returns the raw message of c.
func (c hostileCase) body() []byte {
	switch {
	case c.Body != nil:
		return []byte(*c.Body)
	case c.BodyBase64 != "":
		b, _ := base64.StdEncoding.DecodeString(c.BodyBase64) // parseCase checked it
		return b
	}
	pad := func(n int) string { return strings.Repeat("A", n) }
	switch c.Generate {
	case "20mb-stdin":
		return []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/` + vm1 + `","command":["echo"],"stdin":"` + pad(20<<20) + `"}}}`)
	case "20mb-no-id":
		return []byte(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"lab/` + vm1 + `","command":["echo"],"stdin":"` + pad(20<<20) + `"}}}`)
	case "40mb":
		return []byte(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"list_vms","arguments":{"x":"` + pad(40<<20) + `"}}}`)
	}
	panic("unknown generator " + c.Generate)
}

// check compares what came back with the case's expectation.
func (c hostileCase) check(r reply, sent []byte) error {
	got, want := r.outcome(), c.Expect
	if r.Status != 0 && c.ExpectHTTP != "" {
		want = c.ExpectHTTP
	}
	if got != want && !slices.Contains(c.ExpectAlt, got) {
		return fmt.Errorf("got %s (%.300s); want %s %v", got, r.Body, want, c.ExpectAlt)
	}
	if c.SameID && got == "ok" {
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(sent, &req); err != nil {
			return fmt.Errorf("corpus: same_id on a body without a readable id: %v", err)
		}
		if !bytes.Equal(compact(req.ID), compact(r.ID)) {
			return fmt.Errorf("reply id %.80s; want the request's id %.80s byte for byte", r.ID, req.ID)
		}
	}
	for _, s := range c.Says {
		if r.Result == nil || !strings.Contains(r.Result.text(), s) {
			return fmt.Errorf("reply %.300s; want its text to say %q", r.Body, s)
		}
	}
	if c.Stdout != nil {
		var sc struct {
			Stdout string `json:"stdout"`
		}
		if r.Result == nil || json.Unmarshal(r.Result.Structured, &sc) != nil || sc.Stdout != *c.Stdout {
			return fmt.Errorf("stdout %q; want %q (argv reaches the program as it is)", sc.Stdout, *c.Stdout)
		}
	}
	return nil
}

func compact(b []byte) []byte {
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return b
	}
	return out.Bytes()
}

// sentinels are a file and a process in the guest that no hostile input may change.
type sentinels struct {
	file, text string
	pid        int
}

const (
	sentinelFile = "/tmp/vmgate-chaos-sentinel"
	pwnedFile    = "/tmp/vmgate-chaos-pwned"
)

func plantSentinels(t *testing.T, vm *lab.VM) sentinels {
	t.Helper()
	s := sentinels{file: sentinelFile, text: "sentinel " + newToken()}
	out := guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("rm -f %s; printf '%%s\\n' '%s' > %s && (sleep 3600 </dev/null >/dev/null 2>&1 & echo $!)", pwnedFile, s.text, s.file))
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid < 2 {
		t.Fatalf("sentinel process: guest printed %q", out)
	}
	s.pid = pid
	return s
}

// intact reports what changed, "" when nothing did.
func (s sentinels) intact(t *testing.T, vm *lab.VM) string {
	t.Helper()
	got := guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("cat %s; tr '\\0' ' ' < /proc/%d/cmdline; echo; test -e %s && echo PWNED; true", s.file, s.pid, pwnedFile))
	if want := s.text + "\nsleep 3600 \n"; got != want {
		return fmt.Sprintf("guest sentinels = %q; want %q (file, sleeping process, no %s)", got, want, pwnedFile)
	}
	return ""
}

func (s sentinels) remove(t *testing.T, vm *lab.VM) {
	guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("kill %d; rm -f %s %s /tmp/chaos-*", s.pid, s.file, pwnedFile))
}

// hostileTemplates is a template "lab" (at most 1024 MiB and 2 CPUs) whose
// source names an image that does not exist.
func hostileTemplates(t *testing.T) string {
	return fmt.Sprintf("templates:\n  - name: lab\n    backend: lab\n    source: {image: %q}\n    memory_mb: {default: 256, min: 128, max: 1024}\n    cpus: {max: 2}\n",
		filepath.Join(t.TempDir(), "no-image"))
}

// TestHostile sends every case of the corpus raw over HTTP and stdio and
// checks the refusal; the guest's sentinels must be unchanged at the end.
func TestHostile(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	cases := loadCorpus(t)
	if len(cases) < 150 {
		t.Fatalf("the corpus has %d cases; want at least 150", len(cases))
	}
	v1 := labtest.VM(t, vm1)
	sent := plantSentinels(t, v1)
	token := newToken()
	s := writeConfig(t, configOpts{
		grants: []grantSpec{{name: "agent", token: token, policy: hostilePolicy}, {name: "local", policy: hostilePolicy}},
		vms:    []*lab.VM{v1},
		// vm_create's cases (400-429) meet a real template, whose image
		// does not exist: even a case that got through would boot nothing.
		labDir:    filepath.Join(t.TempDir(), "lab"),
		templates: hostileTemplates(t),
	})
	refused, passed, total := 0, 0, 0
	count := func(c hostileCase, err error) {
		total++
		if err == nil {
			passed++
			if c.Expect != "ok" {
				refused++
			}
		}
	}

	t.Run("http", func(t *testing.T) {
		p := startServe(t, s.cfg)
		cl := newHTTPClient(p.url, token)
		ctx := context.Background()
		if err := cl.initialize(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			if c.Transport == "stdio" || c.Approve != nil || c.Files != nil {
				continue
			}
			body := c.body()
			hdr := map[string][]string{}
			for k, vs := range c.Headers {
				hdr[k] = []string{}
				for _, v := range vs {
					hdr[k] = append(hdr[k], strings.ReplaceAll(v, "$TOKEN", token))
				}
			}
			url := p.url
			if c.Query != "" {
				url += "?" + strings.ReplaceAll(c.Query, "$TOKEN", token)
			}
			if c.Host != "" {
				hdr["Host"] = []string{c.Host}
			}
			r, err := cl.postURL(ctx, url, body, hdr)
			if err == nil {
				err = c.check(r, body)
			}
			count(c, err)
			if err != nil {
				t.Errorf("%s (%s) over HTTP: %v", c.file, c.Name, err)
			}
		}
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})

	t.Run("stdio", func(t *testing.T) {
		sc := openStdio(t, s.cfg, "local")
		for i, c := range cases {
			if c.Transport == "http" || c.Approve != nil || c.Files != nil {
				continue
			}
			body := c.body()
			if bytes.ContainsAny(body, "\n\r") {
				t.Errorf("%s: a stdio case cannot hold a raw newline", c.file)
				continue
			}
			r, err := stdioExchange(sc, body, i, c.Expect != "silent")
			if err == nil {
				err = c.check(r, body)
			}
			count(c, err)
			if err != nil {
				t.Errorf("%s (%s) over stdio: %v", c.file, c.Name, err)
			}
		}
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
	report.add("hostile input", fmt.Sprintf("%d corpus cases over HTTP and stdio (20 and 40 MB bodies generated)", len(cases)),
		fmt.Sprintf("%d of %d exchanges as expected, %d refusals; guest sentinels unchanged", passed, total, refused))
}

// stdioExchange sends one raw line and then a ping; the lines that come
// back before the ping's reply (and the one reply the case waits for, if
// it came after) are the case's.
func stdioExchange(sc *stdioClient, body []byte, n int, wantReply bool) (reply, error) {
	if err := sc.send(body); err != nil {
		return reply{}, err
	}
	syncID := fmt.Sprintf(`"sync-%d"`, n)
	if err := sc.send([]byte(`{"jsonrpc":"2.0","id":` + syncID + `,"method":"ping"}`)); err != nil {
		return reply{}, err
	}
	var got []byte
	synced := false
	for !synced || (wantReply && got == nil) {
		l, err := sc.next(60 * time.Second)
		if err != nil {
			return reply{}, fmt.Errorf("%w (synced %v; stderr %s)", err, synced, tail(sc.stderr.String(), 5))
		}
		var peek struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(l, &peek) == nil && string(peek.ID) == syncID {
			synced = true
			continue
		}
		if got != nil {
			return reply{}, fmt.Errorf("two replies to one message: %.200s and %.200s", got, l)
		}
		got = l
	}
	if got == nil {
		return reply{}, nil // silent
	}
	r := reply{Body: got}
	return r, r.parseRPC(got)
}

// guestRun runs argv in the guest through the agent directly (no vmgate
// server may hold the agent then) and returns its stdout; a non-zero exit
// fails t.
func guestRun(t *testing.T, vm *lab.VM, argv ...string) string {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := qga.New(vm.QGASocket)
	defer c.Close()
	st, err := qga.Agent{Caller: c}.Exec(ctx, qga.ExecRequest{Path: argv[0], Args: argv[1:]})
	if err != nil {
		t.Fatalf("guest-exec %q: %v", argv, err)
	}
	if st.ExitCode != 0 || st.Signal != 0 || st.StdoutTruncated {
		t.Fatalf("guest-exec %q: exit %d (signal %d), output %q (truncated: %v)", argv, st.ExitCode, st.Signal, st.Stdout, st.StdoutTruncated)
	}
	return string(st.Stdout)
}
