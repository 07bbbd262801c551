//go:build linux

package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// step is one named step of a sequence: a session create (creation), a
// restore (restoration), a run's confinement (applySteps).
type step struct {
	name string
	run  func() error
}

// runSteps runs steps in order and stops at the first error, prefixed
// with its step's name, except a *wire.Error, which already says what
// happened and what to do, and is returned as it is.
func runSteps(steps []step) error { return runStepsTimed(steps, nil) }

// runStepsTimed is runSteps that, with took set, tells it how long each
// step that ran took.
func runStepsTimed(steps []step, took func(name string, d time.Duration)) error {
	for _, s := range steps {
		start := time.Now()
		err := s.run()
		if took != nil {
			took(s.name, time.Since(start))
		}
		if err != nil {
			var we *wire.Error
			if errors.As(err, &we) {
				return err
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}
