package audit

import (
	"fmt"
	"os"
	"testing"
)

// TestMain runs the body of a child process when a test started this binary
// as one (the environment says which), and the tests otherwise.
func TestMain(m *testing.M) {
	if v := os.Getenv(killChildEnv); v != "" {
		if err := killChild(v); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
