package main

import (
	"slices"
	"testing"
)

// TestServeArgv: the arguments after "--" reach the stdio child as a
// serve command line whether or not they start with "serve" (README's
// `vmgate call list_vms -- serve --grant local`).
func TestServeArgv(t *testing.T) {
	for _, tc := range []struct{ after, want []string }{
		{nil, []string{"serve"}},
		{[]string{"--grant", "local"}, []string{"serve", "--grant", "local"}},
		{[]string{"serve", "--grant", "local"}, []string{"serve", "--grant", "local"}},
		{[]string{"serve"}, []string{"serve"}},
		{[]string{"--config", "serve"}, []string{"serve", "--config", "serve"}},
	} {
		if got := serveArgv(tc.after); !slices.Equal(got, tc.want) {
			t.Errorf("serveArgv(%q) = %q; want %q", tc.after, got, tc.want)
		}
	}
}
