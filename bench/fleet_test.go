package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// buildFleetPlugin builds bench/fleetplugin as vmgate-plugin-fleet in a
// new directory, as scripts/bench.sh does, and returns the directory.
func buildFleetPlugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "vmgate-plugin-fleet"), "./fleetplugin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build fleetplugin: %v\n%s", err, out)
	}
	return dir
}

// TestFleetServersAgree: vmgate serve over 4 fleet plugins and the bare
// fleet server answer list_vms alike (the same VMs, the same text); the
// bare one pages as the row will ask once list_vms has a limit; the
// checks refuse a wrong answer; a pair of p50s comes out; and the memory
// row's load makes its VMs, each with its lease, and lists them.
func TestFleetServersAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	vmgate, plugins, dir := buildVMGate(t), buildFleetPlugin(t), t.TempDir()
	serve, err := startFleet(ctx, vmgate, plugins, dir, fleetSetup{perBackend: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer stopLogged(serve)
	bare, err := startBareFleet(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer stopLogged(bare)

	paged, err := listVMsPages(ctx, serve.client)
	if err != nil {
		t.Fatalf("listVMsPages(serve) = %v", err)
	}
	if barePaged, err := listVMsPages(ctx, bare.client); err != nil || !barePaged {
		t.Errorf("listVMsPages(bare) = %v, %v; want true (it takes a limit)", barePaged, err)
	}
	args := `{}`
	if paged {
		args = `{"limit":5}`
	}
	var answers [2]fleetAnswer
	var texts [2]string
	for i, c := range []*mcpClient{serve.client, bare.client} {
		res, err := c.callTool(ctx, "list_vms", args)
		if err != nil {
			t.Fatalf("list_vms = %v", err)
		}
		if answers[i], err = decodeFleet(res); err != nil {
			t.Fatal(err)
		}
		texts[i] = res.Content[0].Text
	}
	if !reflect.DeepEqual(answers[0], answers[1]) || texts[0] != texts[1] {
		t.Errorf("list_vms(%s): serve %+v %q; bare %+v %q; want the same", args, answers[0], texts[0], answers[1], texts[1])
	}
	want := 12
	if paged {
		want = 5
	}
	if err := fleetCheck(want, 12, paged)(toolResultOf(t, answers[0])); err != nil {
		t.Errorf("fleetCheck(serve's answer) = %v", err)
	}
	if err := fleetCheck(want+1, 12, paged)(toolResultOf(t, answers[0])); err == nil {
		t.Errorf("fleetCheck(%d) of %d VMs = nil; want an error", want+1, want)
	}
	// The bare server's pages, as the row walks them.
	res, err := bare.client.callTool(ctx, "list_vms", `{"limit":5}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := fleetCheck(5, 12, true)(res); err != nil {
		t.Errorf("bare list_vms(limit 5): %v", err)
	}
	if err := fleetCheck(5, 13, true)(res); err == nil {
		t.Errorf("fleetCheck(total 13) of a total of 12 = nil; want an error")
	}
	if a, b, err := p50Pair(ctx, serve.client, bare.client, 5, "list_vms", args, fleetCheck(want, 12, paged)); err != nil || a <= 0 || b <= 0 {
		t.Errorf("p50Pair = %v, %v, %v; want figures", a, b, err)
	}

	made, err := startFleet(ctx, vmgate, plugins, dir, fleetSetup{templates: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stopLogged(made)
	if _, err := fleetLoad(ctx, made.client, 6); err != nil {
		t.Fatalf("fleetLoad(6) = %v: %s", err, made.stderr.String())
	}
	res, err = made.client.callTool(ctx, "list_vms", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(res.StructuredContent), `"created_by":"local"`); n != 6 {
		t.Errorf("list_vms after fleetLoad(6) shows %d VMs created by local: %s; want 6 (each with its lease)", n, res.StructuredContent)
	}
	if mib, procs, err := treeRSS(made.cmd.Process.Pid); err != nil || mib <= 0 || procs != 1+fleetBackends {
		t.Errorf("treeRSS(serve) = %v MiB, %d processes, %v; want serve and %d plugins", mib, procs, err, fleetBackends)
	}
}

// toolResultOf wraps a decoded answer back into a result.
func toolResultOf(t *testing.T, a fleetAnswer) toolResult {
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return toolResult{StructuredContent: b}
}
