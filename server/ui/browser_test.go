package ui_test

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server"
)

// browser starts a headless Chromium for one test and returns its
// context. It skips when Chromium is missing, unless VMGATE_REQUIRE_VM is
// set (CI), where a missing browser fails the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if path, err = exec.LookPath("chromium-browser"); err != nil {
			if os.Getenv("VMGATE_REQUIRE_VM") != "" {
				t.Fatalf("chromium is not on PATH and VMGATE_REQUIRE_VM is set")
			}
			t.Skip("chromium is not on PATH")
		}
	}
	// chromedp starts the browser with Pdeathsig SIGKILL, waits for it when
	// the allocator context ends, and kills what is left of its process tree.
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// artifacts is where screenshots go: $VMGATE_ARTIFACTS or a temp dir.
func artifacts(t *testing.T) string {
	if d := os.Getenv("VMGATE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// distinctColours counts the distinct colours of a PNG.
func distinctColours(t *testing.T, b []byte) (int, image.Rectangle) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decode screenshot: %v", err)
	}
	seen := map[[4]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x += 2 {
			cr, cg, cb, ca := img.At(x, y).RGBA()
			seen[[4]uint32{cr, cg, cb, ca}] = true
		}
	}
	return len(seen), r
}

func TestBrowserApproveAndDeny(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t)
	run := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("Text(%s): %v", sel, err)
		}
		return s
	}

	// Without a session the page is the login form; the agent's grant
	// token does not open it.
	run("open /ui", chromedp.Navigate(f.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); !strings.HasSuffix(loc, "/ui/login") {
		t.Errorf("Location() without a session = %q; want the login form", loc)
	}
	run("log in with the grant token", chromedp.SendKeys(chromedp.CSS("#token"), agentToken),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("p.err")))
	if got := text("p.err"); !strings.Contains(got, "not the operator token") {
		t.Errorf("login with the agent's token says %q; want a refusal", got)
	}
	run("log in", chromedp.SendKeys(chromedp.CSS("#token"), operatorToken),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#pending")))

	// A parked call appears in the pending list, with its arguments.
	id := f.park(t, `{"vm":"lab/vm1","action":"reboot"}`)
	row := "#approval-" + id
	run("reload", chromedp.Navigate(f.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(row)))
	if got := text(row); !strings.Contains(got, "vm_power") || !strings.Contains(got, "action text, 6 bytes\nreboot") || !strings.Contains(got, "agent") {
		t.Errorf("pending row = %q; want grant, tool and arguments", got)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("FullScreenshot: %v", err)
	}
	file := filepath.Join(artifacts(t), "ui-pending-approval.png")
	if err := os.WriteFile(file, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	if n, r := distinctColours(t, shot); n < 8 || r.Dx() < 600 {
		t.Errorf("screenshot %s: %d distinct colours, %v; want a rendered page (≥ 8 colours, ≥ 600 px wide)", file, n, r)
	}
	t.Logf("screenshot: %s", file)

	// Approve: the agent's retry goes through, once.
	run("approve", chromedp.Click(chromedp.CSS(row+" button.approve")), chromedp.WaitVisible(chromedp.CSS("p.msg")))
	if got := text("p.msg"); !strings.Contains(got, "granted") {
		t.Errorf("message after Approve = %q; want granted", got)
	}
	if res := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"reboot"}`); res.IsError {
		t.Errorf("retry after Approve = %+v; want success", res)
	}
	if n := f.powers.Load(); n != 1 {
		t.Errorf("driver Power calls after the approved retry = %d; want 1", n)
	}

	// Deny with a reason: the retry fails with it and nothing runs.
	id2 := f.park(t, `{"vm":"lab/vm1","action":"reset"}`)
	row2 := "#approval-" + id2
	run("reload", chromedp.Navigate(f.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(row2)))
	run("deny", chromedp.SendKeys(chromedp.CSS(row2+` input[name="reason"]`), "not during the demo"),
		chromedp.Click(chromedp.CSS(row2+" button.deny")), chromedp.WaitVisible(chromedp.CSS("p.msg")))
	if got := text("p.msg"); !strings.Contains(got, "denied") {
		t.Errorf("message after Deny = %q; want denied", got)
	}
	res := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"reset"}`)
	if !res.IsError || !strings.HasPrefix(res.Text, server.TagDenied) || !strings.Contains(res.Text, "not during the demo") || !strings.Contains(res.Text, operatorName) {
		t.Errorf("retry after Deny = %+v; want %s with the operator's name and reason", res, server.TagDenied)
	}
	if n := f.powers.Load(); n != 1 {
		t.Errorf("driver Power calls after the denied retry = %d; want still 1", n)
	}
	run("pending list empty", chromedp.Navigate(f.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#pending p.none")))

	// The audit log names the operator on both decisions; the grant, given
	// no reason, says so (not a bare "alice:").
	var decided []audit.Record
	for _, r := range f.auditRecords(t) {
		if r.Transport == "operator" {
			decided = append(decided, r)
		}
	}
	if len(decided) != 2 || decided[0].Decision != "approval_granted" || decided[1].Decision != "approval_denied" ||
		decided[0].Reason != operatorName+" (no reason given)" || decided[1].Reason != operatorName+": not during the demo" {
		t.Errorf("operator audit records = %+v; want approval_granted and approval_denied by %s", decided, operatorName)
	}
}
