//go:build linux

package agent

import (
	"context"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// BenchmarkHostRunSandboxed measures, on the host's kernel, a run of
// /bin/true in a sandboxed session (thread road: namespaces, paths,
// Landlock, read-only mounts) against one in a plain session, alternating;
// sandbox-us/run is the sandbox's own share.
//
//	go test -run '^$' -bench BenchmarkHostRunSandboxed ./guest/agent/
func BenchmarkHostRunSandboxed(b *testing.B) {
	k := (&Agent{cfg: DefaultConfig()}).probeKernel()
	if k.landlockABI == 0 || !k.netns || !k.mountns {
		b.Skipf("this host kernel lacks Landlock or namespaces (%+v)", k)
	}
	a := sandboxAgent(b)
	ctx := context.Background()
	ids := []string{"5a4db0c5a4db0c000021", "5a4db0c5a4db0c000022"}
	for i, sb := range []*wire.Sandbox{nil, {BestEffort: []wire.Feature{wire.FeatureCgroup}}} {
		if _, err := a.SessionCreate(ctx, wire.SessionCreate{ID: ids[i], Sandbox: sb}); err != nil {
			b.Fatal(err)
		}
		defer a.SessionDestroy(ctx, ids[i])
	}
	var took [2]time.Duration
	for b.Loop() {
		for i, id := range ids {
			start := time.Now()
			res, err := a.Run(ctx, wire.RunRequest{Session: id, Argv: []string{"/bin/true"}})
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("Run = %+v, %v", res, err)
			}
			took[i] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Microseconds())/n, "plain-us/run")
	b.ReportMetric(float64(took[1].Microseconds())/n, "sandboxed-us/run")
	b.ReportMetric(float64((took[1]-took[0]).Microseconds())/n, "sandbox-us/run")
}
