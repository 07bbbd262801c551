package ui_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/ui"
)

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// client is a browser-like HTTP client: cookies, no redirects followed.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login signs c in with token and returns the status of the login POST
// and the page's CSRF token (empty when the login failed).
func login(t *testing.T, f *fixture, c *http.Client, token string) (int, string) {
	t.Helper()
	_, body := get(t, c, f.url+"/ui/login", nil)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET /ui/login has no csrf field:\n%s", body)
	}
	resp, _ := post(t, c, f.url+"/ui/login", url.Values{"csrf": {m[1]}, "token": {token}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		return resp.StatusCode, ""
	}
	resp, body = get(t, c, f.url+"/ui/", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/ after login = %d; want 200", resp.StatusCode)
	}
	m = csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET /ui/ has no csrf field")
	}
	return resp.StatusCode, m[1]
}

func state(t *testing.T, f *fixture, id string) store.ApprovalState {
	t.Helper()
	list, err := f.srv.Approvals().List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list {
		if a.ID == id {
			return a.State
		}
	}
	return ""
}

func TestLoginRefusesGrantTokensAndBadTokens(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name, token string
		want        int
	}{
		{"agent grant token", agentToken, http.StatusUnauthorized},
		{"empty", "", http.StatusUnauthorized},
		{"operator token with a trailing space", operatorToken + " ", http.StatusUnauthorized},
		{"hash of the operator token", sha(operatorToken), http.StatusUnauthorized},
		{"operator token", operatorToken, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := login(t, f, client(t), tt.token); got != tt.want {
				t.Errorf("login(%q) = %d; want %d", tt.token, got, tt.want)
			}
		})
	}
	// A bearer grant token does not open the page either.
	resp, body := get(t, client(t), f.url+"/ui/", map[string]string{"Authorization": "Bearer " + agentToken})
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(body, "Pending approvals") {
		t.Errorf("GET /ui/ with the agent's bearer token = %d; want 303 to the login form", resp.StatusCode)
	}
}

func TestDecideRefusesBadRequests(t *testing.T) {
	f := newFixture(t)
	id := f.park(t, `{"vm":"lab/vm1","action":"reboot"}`)
	c := client(t)
	if code, _ := login(t, f, c, operatorToken); code != http.StatusOK {
		t.Fatalf("login = %d", code)
	}
	_, csrf := login(t, f, c, operatorToken)
	good := func(mod func(url.Values)) url.Values {
		v := url.Values{"csrf": {csrf}, "id": {id}, "action": {"approve"}, "reason": {"ok"}}
		mod(v)
		return v
	}
	tests := []struct {
		name   string
		c      *http.Client
		form   url.Values
		hdr    map[string]string
		path   string
		status int
	}{
		{"no cookie", client(t), good(func(url.Values) {}), nil, "/ui/decide", http.StatusForbidden},
		{"wrong csrf", c, good(func(v url.Values) { v.Set("csrf", strings.Repeat("0", 64)) }), nil, "/ui/decide", http.StatusForbidden},
		{"no csrf", c, good(func(v url.Values) { v.Del("csrf") }), nil, "/ui/decide", http.StatusForbidden},
		{"csrf of the login form", c, good(func(v url.Values) { v.Set("csrf", "AAAA") }), nil, "/ui/decide", http.StatusForbidden},
		{"unknown action", c, good(func(v url.Values) { v.Set("action", "nuke") }), nil, "/ui/decide", http.StatusBadRequest},
		{"hostile id", c, good(func(v url.Values) { v.Set("id", "../../etc/passwd") }), nil, "/ui/decide", http.StatusBadRequest},
		{"empty id", c, good(func(v url.Values) { v.Set("id", "") }), nil, "/ui/decide", http.StatusBadRequest},
		{"reason too long", c, good(func(v url.Values) { v.Set("reason", strings.Repeat("x", ui.MaxReasonLen+1)) }), nil, "/ui/decide", http.StatusBadRequest},
		{"reason with a newline", c, good(func(v url.Values) { v.Set("reason", "ok\nforged: line") }), nil, "/ui/decide", http.StatusBadRequest},
		{"foreign origin", c, good(func(url.Values) {}), map[string]string{"Origin": "http://evil.example"}, "/ui/decide", http.StatusForbidden},
		{"rebinding host", c, good(func(url.Values) {}), map[string]string{"Host": "evil.example"}, "/ui/decide", http.StatusForbidden},
		{"GET decide", c, nil, nil, "/ui/decide", http.StatusNotFound},
		{"pending without cookie", client(t), nil, nil, "/ui/pending", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var resp *http.Response
			if tt.form == nil {
				resp, _ = get(t, tt.c, f.url+tt.path, tt.hdr)
			} else {
				req, _ := http.NewRequest("POST", f.url+tt.path, strings.NewReader(tt.form.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				for k, v := range tt.hdr {
					if k == "Host" {
						req.Host = v
					} else {
						req.Header.Set(k, v)
					}
				}
				r, err := tt.c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				r.Body.Close()
				resp = r
			}
			if resp.StatusCode != tt.status {
				t.Errorf("%s %s = %d; want %d", tt.name, tt.path, resp.StatusCode, tt.status)
			}
			if got := state(t, f, id); got != store.ApprovalPending {
				t.Errorf("approval state after %s = %q; want still pending", tt.name, got)
			}
		})
	}
	// The same form, valid, does decide: the refusals above were not luck.
	resp, _ := post(t, c, f.url+"/ui/decide", good(func(url.Values) {}), nil)
	if resp.StatusCode != http.StatusSeeOther || state(t, f, id) != store.ApprovalGranted {
		t.Errorf("valid decide = %d, state %q; want 303 and granted", resp.StatusCode, state(t, f, id))
	}
}

func TestPageShowsDecisionsCountersAndVMs(t *testing.T) {
	f := newFixture(t)
	for range 3 {
		if res := f.call(t, "list_vms", `{}`); res.IsError {
			t.Fatalf("list_vms = %+v", res)
		}
	}
	f.park(t, `{"vm":"lab/vm2","action":"start"}`)
	c := client(t)
	login(t, f, c, operatorToken)
	// The parked call's decision record is written lazily (with the next
	// batch, or within the log's interval): wait for it to land.
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body = get(t, c, f.url+"/ui/", nil)
		if strings.Contains(body, "d-approve") || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{
		"<td>list_rate (grant agent)</td>", // the counter, readable
		"<td>3</td><td>50</td>",            // used and limit
		"lab/vm1", "connected (9.2)", "lab/vm2", "not connected",
		`<code>action</code>`, `>start</pre>`, // the parked call's arguments
		`<tr class="d-approve">`, // the parked call among the decisions
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /ui/ lacks %q", want)
		}
	}
	if strings.Contains(body, "grant=5:") {
		t.Errorf("GET /ui/ shows a counter's key (list_rate|grant=5:agent); want its name and scope in words")
	}
	_, filtered := get(t, c, f.url+"/ui/?tool=vm_power", nil)
	if strings.Contains(filtered, "<code>list_vms</code></td><td></td><td>allow") || !strings.Contains(filtered, "<code>vm_power</code>") {
		t.Errorf("GET /ui/?tool=vm_power still shows list_vms decisions or lacks vm_power")
	}
}
