package virtualbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// TestParseSnapshotList reads showSnapshots' machine-readable tree: the
// suffixes make the parents, a raw description runs over lines, the
// current snapshot is marked; broken output is an error.
func TestParseSnapshotList(t *testing.T) {
	out := `SnapshotName="base"
SnapshotUUID="11111111-1111-4111-8111-111111111111"
SnapshotDescription="first line
second = line"
SnapshotName-1="child"
SnapshotUUID-1="22222222-2222-4222-8222-222222222222"
CurrentSnapshotName="child"
CurrentSnapshotUUID="22222222-2222-4222-8222-222222222222"
CurrentSnapshotNode="SnapshotName-1"
SnapshotName-2="other"
SnapshotUUID-2="33333333-3333-4333-8333-333333333333"
SnapshotDescription-2=""
`
	got, err := ParseSnapshotList([]byte(out))
	if err != nil {
		t.Fatalf("ParseSnapshotList() = %v", err)
	}
	want := []vboxSnapshot{
		{uuid: "11111111-1111-4111-8111-111111111111", Snapshot: hypervisor.Snapshot{Name: "base", ID: "vbox:11111111-1111-4111-8111-111111111111", Description: "first line\nsecond = line"}},
		{uuid: "22222222-2222-4222-8222-222222222222", Snapshot: hypervisor.Snapshot{Name: "child", ID: "vbox:22222222-2222-4222-8222-222222222222", Parent: "base", Current: true}},
		{uuid: "33333333-3333-4333-8333-333333333333", Snapshot: hypervisor.Snapshot{Name: "other", ID: "vbox:33333333-3333-4333-8333-333333333333", Parent: "base"}},
	}
	if len(got) != len(want) {
		t.Fatalf("ParseSnapshotList() = %+v; want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ParseSnapshotList()[%d] = %+v; want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{
		"SnapshotName=\"a\nno end",
		"garbage\n",
		"SnapshotName-1=\"orphan\"\nSnapshotUUID-1=\"22222222-2222-4222-8222-222222222222\"\n",
		"SnapshotUUID=\"11111111-1111-4111-8111-111111111111\"\n",
	} {
		if got, err := ParseSnapshotList([]byte(bad)); err == nil {
			t.Errorf("ParseSnapshotList(%q) = %+v, nil; want an error", bad, got)
		}
	}
}

// TestReadSnapshotSettings reads timeStamp and stateFile of nested
// Snapshot elements from a settings file; a missing or oversized file is
// an error.
func TestReadSnapshotSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.vbox")
	doc := `<?xml version="1.0"?>
<VirtualBox xmlns="http://www.virtualbox.org/" version="1.19-linux">
  <Machine uuid="{aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa}" name="m" currentSnapshot="{22222222-2222-4222-8222-222222222222}">
    <Snapshot uuid="{11111111-1111-4111-8111-111111111111}" name="base" timeStamp="2024-05-06T07:08:09Z">
      <Description>d</Description>
      <Snapshots>
        <Snapshot uuid="{22222222-2222-4222-8222-222222222222}" name="child" timeStamp="2024-05-06T08:00:00Z" stateFile="Snapshots/{2222}.sav"/>
      </Snapshots>
    </Snapshot>
  </Machine>
</VirtualBox>`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readSnapshotSettings(path)
	if err != nil {
		t.Fatalf("readSnapshotSettings() = %v", err)
	}
	want := map[string]snapshotFacts{
		"11111111-1111-4111-8111-111111111111": {at: time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)},
		"22222222-2222-4222-8222-222222222222": {at: time.Date(2024, 5, 6, 8, 0, 0, 0, time.UTC), memory: true},
	}
	if len(got) != len(want) {
		t.Fatalf("readSnapshotSettings() = %+v; want %+v", got, want)
	}
	for k, w := range want {
		if g := got[k]; !g.at.Equal(w.at) || g.memory != w.memory {
			t.Errorf("readSnapshotSettings()[%s] = %+v; want %+v", k, g, w)
		}
	}
	if _, err := readSnapshotSettings(filepath.Join(dir, "none.vbox")); err == nil {
		t.Errorf("readSnapshotSettings(missing) = nil; want an error")
	}
	big := filepath.Join(dir, "big.vbox")
	if err := os.WriteFile(big, append([]byte("<VirtualBox><Machine>"), bytes.Repeat([]byte(" "), maxSettingsFile+10)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSnapshotSettings(big); err == nil {
		t.Errorf("readSnapshotSettings(%d bytes) = nil; want an error", maxSettingsFile+10)
	}
}

// TestSnapshotRefusals: requests the driver refuses before running
// VBoxManage at all (it is not even there).
func TestSnapshotRefusals(t *testing.T) {
	d := &Driver{bin: "/nonexistent/VBoxManage"}
	ctx := context.Background()
	for _, tc := range []struct {
		req  hypervisor.SnapshotRequest
		want error
	}{
		{hypervisor.SnapshotRequest{Name: "ok-name", Description: `say "hi"`, Memory: true}, hypervisor.ErrInvalidArgument},
		{hypervisor.SnapshotRequest{Name: "ok-name"}, hypervisor.ErrSnapshotDiskOnly},
		{hypervisor.SnapshotRequest{Name: "1bad", Memory: true}, hypervisor.ErrInvalidArgument},
	} {
		if _, err := d.SnapshotCreate(ctx, "vm", tc.req); !errors.Is(err, tc.want) {
			t.Errorf("SnapshotCreate(%+v) = %v; want %v", tc.req, err, tc.want)
		}
	}
	if err := d.SnapshotRevert(ctx, "-vm", "ok-name"); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("SnapshotRevert(-vm) = %v; want %v", err, hypervisor.ErrUnknownVM)
	}
	if err := d.SnapshotDelete(ctx, "vm", "a\x00b"); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("SnapshotDelete(a NUL b) = %v; want %v", err, hypervisor.ErrInvalidArgument)
	}
}

// TestSnapshotTimeUnknown: where the machine's settings file cannot be
// read, `snapshot list --machinereadable` is all there is, and it gives no
// time (VBoxManageInfo.cpp showSnapshots prints name, UUID and description
// only): the snapshot then has no created_at at all, never the zero time
// "0001-01-01T00:00:00Z" (issue 32, item 14).
func TestSnapshotTimeUnknown(t *testing.T) {
	m := machine("m", uuidOff, "", "")
	m.Snapshots = []*vboxemu.Snapshot{{UUID: "11111111-1111-4111-8111-111111111111", Name: "base",
		Taken: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC), StateAtTake: "poweroff"}}
	m.CurrentSnapshot = m.Snapshots[0].UUID
	// The emulator writes the settings file on the world's first change:
	// until then the machine has none, as on a host whose file vmgate's
	// user cannot read.
	e := newEmulator(t, "7.1", []*vboxemu.Machine{m})
	d := e.driver(t)
	ctx := context.Background()
	if _, err := os.Stat(filepath.Join(e.dir, "m", "m.vbox")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("settings file: %v; want none yet", err)
	}
	list, err := d.SnapshotList(ctx, "m")
	if err != nil || len(list) != 1 || list[0].Name != "base" || !list[0].CreatedAt.IsZero() {
		t.Fatalf("SnapshotList(m) without its settings file = %+v, %v; want base with no time", list, err)
	}
	raw, err := json.Marshal(list[0])
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("created_at")) {
		t.Errorf("a snapshot whose time is unknown marshals as %s; want no created_at", raw)
	}

	// Once the file is there, the times come from it.
	if code, out := e.run(t, "snapshot", "m", "take", "second"); code != 0 {
		t.Fatalf("snapshot take = %d, %s", code, out)
	}
	list, err = d.SnapshotList(ctx, "m")
	if err != nil || len(list) != 2 {
		t.Fatalf("SnapshotList(m) with its settings file = %+v, %v; want 2 snapshots", list, err)
	}
	for _, s := range list {
		raw, _ := json.Marshal(s)
		if s.CreatedAt.IsZero() || !bytes.Contains(raw, []byte(`"created_at":"`+s.CreatedAt.UTC().Format(time.RFC3339))) {
			t.Errorf("snapshot %s = %s; want its created_at from the settings file", s.Name, raw)
		}
	}
}
