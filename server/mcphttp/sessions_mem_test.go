package mcphttp

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// heapAfterGC is the live heap after a full collection.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// initializeDirect runs one initialize through h without a network.
func initializeDirect(t testing.TB, h http.Handler) string {
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(mcptest.InitMsg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer local-token")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	sid := rec.Header().Get("Mcp-Session-Id")
	if rec.Code != http.StatusOK || sid == "" {
		t.Fatalf("initialize = %d %q; want 200 with a session", rec.Code, rec.Body.String())
	}
	return sid
}

// TestHTTPSessionMemory measures what a live HTTP session costs (our
// registry entry and mcp-go's state for it) and checks that the caps bound
// it: sessions beyond the cap are evicted and their memory is released,
// so 20 times more initializes than the cap leave the heap near what the
// cap's sessions cost, not 20 times that.
func TestHTTPSessionMemory(t *testing.T) {
	const live = 2000
	f := servertest.New(t, servertest.Options{})
	h := New(f.S, Options{Sessions: SessionLimits{MaxPerGrant: live, MaxTotal: live}, RequestsPerMinute: 1 << 20})
	initializeDirect(t, h) // warm up pools and lazily built state
	before := heapAfterGC()
	for range live {
		initializeDirect(t, h)
	}
	perSession := (int64(heapAfterGC()) - int64(before)) / live
	if st := h.SessionStats(); st.Live != live {
		t.Fatalf("SessionStats().Live = %d; want %d", st.Live, live)
	}
	t.Logf("one live HTTP session costs %d bytes of heap", perSession)
	if perSession <= 0 || perSession > 16<<10 {
		t.Errorf("a live HTTP session costs %d bytes; want between 1 byte and 16 KiB", perSession)
	}

	const capped = 64
	f2 := servertest.New(t, servertest.Options{})
	h2 := New(f2.S, Options{Sessions: SessionLimits{MaxPerGrant: capped, MaxTotal: capped}, RequestsPerMinute: 1 << 20})
	initializeDirect(t, h2)
	before = heapAfterGC()
	for range 20 * capped * 4 {
		initializeDirect(t, h2)
	}
	grown := int64(heapAfterGC()) - int64(before)
	st := h2.SessionStats()
	if st.Live != capped || st.Evicted < 20*capped*4-capped {
		t.Errorf("SessionStats() after %d initializes = %+v; want %d live and the rest evicted", 20*capped*4, st, capped)
	}
	t.Logf("%d initializes with a cap of %d: heap grew %d bytes (%d per live session)", 20*capped*4, capped, grown, grown/capped)
	if limit := 2 * capped * max(perSession, 1024); grown > limit {
		t.Errorf("heap grew %d bytes over %d initializes with a cap of %d sessions; want at most %d (twice what %d live sessions cost): evicted sessions are not released",
			grown, 20*capped*4, capped, limit, capped)
	}
}
