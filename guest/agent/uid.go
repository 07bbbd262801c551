//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The range session uids and gids come from by default: above every range
// a distribution or systemd hands out (systemd leaves 1879048192 and up
// unused), below 2^31.
const (
	DefaultUIDBase  = 1_900_000_000
	DefaultUIDCount = 65536
)

// allocateIDLocked picks a number in the configured range to be a new
// session's uid and gid: one no other session holds, no live process runs
// with (as any of its uids or gids), and /etc/passwd and /etc/group do not
// name. The search starts at a random place, so a destroyed session's
// number is seldom reused at once. The caller holds the lock.
func (a *Agent) allocateIDLocked(taken map[int]bool) (int, error) {
	base, n := a.cfg.UIDBase, a.cfg.UIDCount
	var busy map[int]bool
	if a.res != nil {
		busy = a.res.idsInUseKept(a, base, n)
	} else {
		busy = a.idsInUse(base, n)
	}
	for id := range taken {
		busy[id] = true
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	start := int(binary.LittleEndian.Uint64(r[:]) % uint64(n))
	for i := 0; i < n; i++ {
		id := base + (start+i)%n
		if !busy[id] {
			return id, nil
		}
	}
	return 0, fmt.Errorf("no free uid in %d..%d", base, base+n-1)
}

// idsInUse collects the numbers in [base, base+n) that a live process runs
// with or /etc/passwd or /etc/group names.
func (a *Agent) idsInUse(base, n int) map[int]bool {
	busy := map[int]bool{}
	add := func(s string) {
		if v, err := strconv.Atoi(s); err == nil && v >= base && v < base+n {
			busy[v] = true
		}
	}
	for _, f := range []struct {
		path  string
		field int
	}{{"/etc/passwd", 2}, {"/etc/group", 2}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if parts := strings.Split(sc.Text(), ":"); len(parts) > f.field {
				add(parts[f.field])
			}
		}
	}
	pids, _ := a.proc.pids()
	for _, pid := range pids {
		_ = a.proc.readFile(pid, "status", func(b []byte) {
			for _, key := range []string{"Uid:", "Gid:"} {
				for _, v := range statusIDs(b, key) {
					add(strconv.FormatUint(uint64(v), 10))
				}
			}
		})
	}
	return busy
}

// statusIDs returns the numbers of a "Uid:" or "Gid:" line of
// /proc/P/status (real, effective, saved, filesystem); nil when missing.
func statusIDs(b []byte, key string) []uint32 {
	var line []byte
	if rest, ok := bytes.CutPrefix(b, []byte(key)); ok {
		line = rest
	} else if i := bytes.Index(b, []byte("\n"+key)); i >= 0 {
		line = b[i+1+len(key):]
	} else {
		return nil
	}
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	var out []uint32
	for _, f := range bytes.Fields(line) {
		v, err := strconv.ParseUint(string(f), 10, 32)
		if err != nil {
			return nil
		}
		out = append(out, uint32(v))
	}
	return out
}
