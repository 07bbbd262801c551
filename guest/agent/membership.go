//go:build linux

package agent

import (
	"crypto/subtle"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// A process belongs to a session when one of these holds, strongest first:
//
//   - it is in the session's cgroup (/vmgate/<id>/...), which only root can
//     move it out of (the group is root's, and a sandboxed session has
//     neither the uid nor, under Landlock, the write access to do it);
//   - it runs with the session's uid (any of real, effective, saved or
//     filesystem), which a session process cannot change (no capabilities,
//     no_new_privs);
//   - its environment has VMGATE_SESSION=<id>.<token>, where token is the
//     session's secret: in its metadata (root-only) and in the environment
//     of the session's own processes, never in a call's arguments.
//
// A bare VMGATE_SESSION=<id>, which any exec could set, proves nothing:
// it is accepted only for sessions whose metadata has no token (created
// by a vmgate-guest before tokens), so that destroying one still finds
// its processes.

// meta is a session's metadata file: the Session that is listed, plus what
// only vmgate-guest sees.
type meta struct {
	wire.Session
	// Token is the secret of the session's environment marker.
	Token string `json:"token,omitempty"`
	// NetNS is the session's bind-mounted network namespace; "" for none.
	NetNS string `json:"netns,omitempty"`
	// OneShot marks a session the resident helper made for one one-shot
	// run (pool.go): no other command joins it, the host's lists leave it
	// out, and a helper that starts destroys those its predecessor left.
	OneShot bool `json:"oneshot,omitempty"`
}

// marker is the value of SessionEnv for m's processes.
func (m meta) marker() string {
	if m.Token == "" {
		return m.ID
	}
	return m.ID + "." + m.Token
}

// uid is the session's own uid; -1 when it has none.
func (m meta) uid() int {
	if m.Sandbox == nil || m.Enforced.User != wire.UserSession {
		return -1
	}
	return m.Enforced.UID
}

// sessionIndex maps uids and markers to sessions, from every metadata file.
// It is built once per scan, on first need.
type sessionIndex struct {
	byUID   map[uint32]string // session uid → id
	markers map[string]string // id → the marker its processes carry
}

// loadIndex reads every session's metadata. Unreadable files are skipped
// (their sessions' uids and markers count for nothing).
func (a *Agent) loadIndex() *sessionIndex {
	ix := &sessionIndex{byUID: map[uint32]string{}, markers: map[string]string{}}
	metas, err := a.readAllMeta()
	if err != nil {
		a.cfg.Logger.Warn("session index", "err", err)
	}
	for _, m := range metas {
		if uid := m.uid(); uid > 0 {
			ix.byUID[uint32(uid)] = m.ID
		}
		ix.markers[m.ID] = m.marker()
	}
	return ix
}

// markerSession returns the session a marker value proves, "" for none.
func (ix *sessionIndex) markerSession(v string) string {
	id, _, _ := strings.Cut(v, ".")
	want, ok := ix.markers[id]
	if !ok || subtle.ConstantTimeCompare([]byte(v), []byte(want)) != 1 {
		return ""
	}
	return id
}

// memberScan finds the sessions of the processes of one scan. It is not
// safe for concurrent use.
type memberScan struct {
	a          *Agent
	ix         *sessionIndex // built on first need
	base, last uint32        // the session uid range
}

func (a *Agent) memberScan() memberScan {
	return memberScan{a: a, base: uint32(a.cfg.UIDBase), last: uint32(a.cfg.UIDBase + a.cfg.UIDCount - 1)}
}

func (s *memberScan) index() *sessionIndex {
	if s.ix == nil {
		s.ix = s.a.loadIndex()
	}
	return s.ix
}

// membership is what memberScan.of found.
type membership struct {
	session string
	uid     uint32 // the real uid, when haveUID
	haveUID bool
}

// of returns the session of the process whose /proc directory is d (and
// its real uid, read on the way): by cgroup, then uid, then marker. buf is
// the caller's reusable read buffer.
func (s *memberScan) of(d pidDir, buf *[]byte, kthread bool) membership {
	var m membership
	read := func(name string) ([]byte, error) {
		b, err := d.read(name, *buf)
		*buf = b[:0]
		return b, err
	}
	if b, err := read("cgroup"); err == nil {
		m.session = sessionOfCgroup(cgroupV2Path(b))
	}
	if b, err := read("status"); err == nil {
		ids := statusIDs(b, "Uid:")
		if len(ids) > 0 {
			m.uid, m.haveUID = ids[0], true
		}
		for _, id := range ids {
			if m.session == "" && id >= s.base && id <= s.last {
				m.session = s.index().byUID[id]
			}
		}
	}
	if m.session != "" || kthread {
		return m // a kernel thread has no memory map: an empty environ
	}
	if b, err := read("environ"); err == nil {
		if v, ok := environValue(b, SessionEnv); ok {
			m.session = s.index().markerSession(v)
		}
	}
	return m
}
