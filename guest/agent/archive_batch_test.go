//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// batchTree is d/ (there already) and the files d/f0 … d/f9 ("new 0" … "new 9"), with
// d/f5 there already ("old", replaced by the archive).
func batchTree(t *testing.T, target string) []byte {
	t.Helper()
	spec := []specEntry{{typ: "dir", name: "d/", mode: 0o755}}
	for i := range 10 {
		spec = append(spec, specEntry{typ: "file", name: fmt.Sprintf("d/f%d", i), mode: 0o644, arg: fmt.Sprintf("new %d", i)})
	}
	if err := os.Mkdir(filepath.Join(target, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "d/f5"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	return buildTar(t, spec, false)
}

// namedFiles lists the files d/f<i> in target whose content is the
// archive's, in order.
func namedFiles(target string) []int {
	var got []int
	for i := range 10 {
		if b, err := os.ReadFile(filepath.Join(target, fmt.Sprintf("d/f%d", i))); err == nil && string(b) == fmt.Sprintf("new %d", i) {
			got = append(got, i)
		}
	}
	return got
}

// TestArchiveWriteBatches: an archive's files get their names only after
// the sync of their batch (so no named file lacks its data after a crash),
// in the archive's order; a failed sync or a failure half-way through a
// batch stops the extraction with the earlier batches in place, every file
// of them complete, the replaced file of the failed batch as it was, and
// no temporary file behind.
func TestArchiveWriteBatches(t *testing.T) {
	errFault := errors.New("injected fault")
	first4, first5 := []int{0, 1, 2, 3}, []int{0, 1, 2, 3, 4}
	tests := []struct {
		name string
		// sync and rename are the faults at the n-th syncfs and rename
		// (from 1); 0 for none.
		sync, rename int
		wantErr      string // "" for success
		want         []int  // files with the archive's content after
	}{
		{"whole", 0, 0, "", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"second sync fails", 2, 0, "stopped after writing 4 entries", first4},
		{"sixth rename fails", 0, 6, "stopped after writing 5 entries", first5},
	}
	bothTemps(t, func(t *testing.T, named bool) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				s := newArchiveSite(t)
				data := batchTree(t, s.target)
				a := newFileAgent(t)
				var syncs [][]int // the archive's files named at each sync
				renames := 0
				a.faults = fileFaults{noTmpfile: named, archiveBatch: 4,
					fsync: func(what string) error {
						if what != "fs" {
							return nil
						}
						syncs = append(syncs, namedFiles(s.target))
						if len(syncs) == tc.sync {
							return errFault
						}
						return nil
					},
					rename: func() error {
						if renames++; renames == tc.rename {
							return errFault
						}
						return nil
					}}
				got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{}, source(data))
				switch {
				case tc.wantErr == "" && (err != nil || got.Written != 10):
					t.Fatalf("ArchiveWrite = %d written, %v; want 10, nil", got.Written, err)
				case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errFault)):
					t.Fatalf("ArchiveWrite = %v; want the fault, saying %q", err, tc.wantErr)
				}
				// Batches of 4: at each sync, the files of the batches before.
				for i, names := range syncs[:min(len(syncs), 3)] {
					if want := []int{0, 1, 2, 3, 4, 5, 6, 7}[:4*i]; !slices.Equal(names, want) {
						t.Errorf("sync %d: files named %v; want %v (only the earlier batches')", i+1, names, want)
					}
				}
				if g := namedFiles(s.target); !slices.Equal(g, tc.want) {
					t.Errorf("files with the archive's content = %v; want %v", g, tc.want)
				}
				if b, _ := os.ReadFile(filepath.Join(s.target, "d/f5")); tc.wantErr != "" && string(b) != "old" {
					t.Errorf("d/f5 after the failure = %q; want the old file, %q", b, "old")
				}
				for i := range 10 {
					if tc.wantErr != "" && !slices.Contains(tc.want, i) && i != 5 {
						if _, err := os.Lstat(filepath.Join(s.target, fmt.Sprintf("d/f%d", i))); !os.IsNotExist(err) {
							t.Errorf("d/f%d after the failure: %v; want nothing under its name", i, err)
						}
					}
				}
				if l := leftovers(t, filepath.Join(s.target, "d")); len(l) != 0 {
					t.Errorf("temporary files left: %v", l)
				}
			})
		}
	})
}

// TestArchiveWriteLinkWaitsForBatch: a hard link and a symlink replacing
// a file of the archive come after the files before them are in place.
func TestArchiveWriteLinkWaitsForBatch(t *testing.T) {
	s := newArchiveSite(t)
	spec := []specEntry{
		{typ: "file", name: "a", mode: 0o644, arg: "first"},
		{typ: "hardlink", name: "b", arg: "a"},
		{typ: "file", name: "c", mode: 0o644, arg: "third"},
		{typ: "symlink", name: "c", arg: "a"},
		{typ: "file", name: "e", mode: 0o600, arg: "last"},
	}
	a := newFileAgent(t)
	a.faults.archiveBatch = 100
	got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{}, source(buildTar(t, spec, false)))
	if err != nil || got.Written != 5 || got.Refused != 0 {
		t.Fatalf("ArchiveWrite = %d written, %d refused, %v; want 5, 0", got.Written, got.Refused, err)
	}
	want := map[string]string{".": "drwxr-xr-x", "existing": "-rw-r--r-- old", "planted": "Lrwxrwxrwx -> " + s.outside,
		"a": "-rw-r--r-- first", "b": "-rw-r--r-- first", "c": "Lrwxrwxrwx -> a", "e": "-rw------- last"}
	if d := sameSnapshot(want, snapshot(t, s.target)); d != "" {
		t.Errorf("target: %s", d)
	}
	if actions := []string{got.Entries[0].Action, got.Entries[1].Action, got.Entries[2].Action, got.Entries[3].Action}; !slices.Equal(actions, []string{wire.ActionCreate, wire.ActionCreate, wire.ActionCreate, wire.ActionReplace}) {
		t.Errorf("actions = %v; want create, create, create, replace", actions)
	}
}

// TestArchiveWriteReplaceKeepsOwnerAndMode: a file the archive replaces
// keeps its owner and gets the archive's mode, setuid bit included where
// the policy allows it (chown, which clears that bit, comes first).
func TestArchiveWriteReplaceKeepsOwnerAndMode(t *testing.T) {
	s := newArchiveSite(t)
	p := filepath.Join(s.target, "existing")
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	spec := []specEntry{{typ: "file", name: "existing", mode: 0o4755, arg: "new"}}
	a := newFileAgent(t)
	got, err := a.ArchiveWrite(context.Background(), s.target, ArchiveWriteOptions{SpecialBits: true}, source(buildTar(t, spec, false)))
	if err != nil || got.Written != 1 {
		t.Fatalf("ArchiveWrite = %d written, %v; want 1", got.Written, err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Mode&0o7777 != 0o4755 || sys.Uid != 1234 || sys.Gid != 5678 {
		t.Errorf("replaced file: mode %#o, owner %d:%d; want 04755, 1234:5678", sys.Mode&0o7777, sys.Uid, sys.Gid)
	}
}
