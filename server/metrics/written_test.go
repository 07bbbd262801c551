package metrics

import (
	"context"
	"testing"

	"github.com/vmgate/vmgate/policy/audit"
)

// writtenAuditor is a fakeAuditor that also has AppendWritten.
type writtenAuditor struct {
	*fakeAuditor
	AppendWrittenFunc func(ctx context.Context, rec audit.Record) (uint64, error)
}

func (w *writtenAuditor) AppendWritten(ctx context.Context, rec audit.Record) (uint64, error) {
	return w.AppendWrittenFunc(ctx, rec)
}

// TestAuditorForwardsAppendWritten: the wrapped log's AppendWritten (a
// decision that need not wait for an fsync) is what the wrapper calls, and
// the call is counted like an Append; a log without it gets Append.
func TestAuditorForwardsAppendWritten(t *testing.T) {
	const series = `vmgate_calls_total{decision="allow",grant="local",tool="list_vms"}`
	rec := audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "allow"}
	var appends, written int
	base := &fakeAuditor{
		AppendFunc:     func(context.Context, audit.Record) (uint64, error) { appends++; return 1, nil },
		AppendLazyFunc: func(context.Context, audit.Record) error { return nil },
	}
	for _, tt := range []struct {
		name                  string
		next                  Auditor
		wantAppends, wantWrit int
	}{
		{"with AppendWritten", &writtenAuditor{base, func(context.Context, audit.Record) (uint64, error) { written++; return 2, nil }}, 0, 1},
		{"without", base, 1, 0},
	} {
		appends, written = 0, 0
		m := newMetrics(t, Options{})
		a, ok := m.Auditor(tt.next).(interface {
			AppendWritten(ctx context.Context, rec audit.Record) (uint64, error)
		})
		if !ok {
			t.Fatalf("%s: the wrapper has no AppendWritten", tt.name)
		}
		if _, err := a.AppendWritten(context.Background(), rec); err != nil {
			t.Fatalf("%s: AppendWritten = %v", tt.name, err)
		}
		if appends != tt.wantAppends || written != tt.wantWrit {
			t.Errorf("%s: Append called %d times, AppendWritten %d; want %d and %d", tt.name, appends, written, tt.wantAppends, tt.wantWrit)
		}
		if got := value(scrape(t, m), series); got != "1" {
			t.Errorf("%s: %s = %q; want 1", tt.name, series, got)
		}
	}
}
