package catalog

import (
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// TestProgress: a handler's reports are kept, the latest wins, reports
// from several goroutines are safe, and a nil Progress (a client that asked
// for no progress) takes reports and holds nothing.
func TestProgress(t *testing.T) {
	var none *Progress
	none.Report("dropped")
	if got := none.Latest(); got != "" {
		t.Errorf("nil Progress Latest() = %q; want \"\"", got)
	}
	p := &Progress{}
	if got := p.Latest(); got != "" {
		t.Errorf("new Progress Latest() = %q; want \"\"", got)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { p.Report("busy") })
	}
	wg.Wait()
	p.Report("line 3")
	if got := p.Latest(); got != "line 3" {
		t.Errorf("Latest() = %q; want the last report, line 3", got)
	}
}

// TestResultContent: what a result carries after its text (an image) is
// published after the text, on a success and on an error alike; a result
// without any is the text alone.
func TestResultContent(t *testing.T) {
	img := mcp.NewImageContent("iVBORw0KGgo=", "image/png")
	tests := []struct {
		name string
		r    Result
		want int // contents
	}{
		{"text only", Success(map[string]any{"vm": "lab/vm1"}, "ok"), 1},
		{"with an image", Result{Text: "screen", Structured: map[string]any{}, Content: []mcp.Content{img}}, 2},
		{"error with an image", Result{Tag: TagBackend, Text: "partial", Content: []mcp.Content{img}}, 2},
	}
	for _, tt := range tests {
		res := tt.r.MCP()
		if len(res.Content) != tt.want {
			t.Errorf("%s: MCP() has %d contents; want %d", tt.name, len(res.Content), tt.want)
			continue
		}
		if _, ok := res.Content[0].(mcp.TextContent); !ok {
			t.Errorf("%s: MCP()'s first content is %T; want the text", tt.name, res.Content[0])
		}
		if tt.want == 2 {
			if got, ok := res.Content[1].(mcp.ImageContent); !ok || got.MIMEType != "image/png" {
				t.Errorf("%s: MCP()'s second content = %#v; want the image", tt.name, res.Content[1])
			}
		}
	}
}
