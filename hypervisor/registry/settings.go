package registry

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// FieldError is a Validate error about one setting. Field is its path in
// json names ("url", "vms[1].name"; empty for the settings as a whole). It
// matches hypervisor.ErrInvalidArgument with errors.Is.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error()
}

// Unwrap returns the cause and hypervisor.ErrInvalidArgument.
func (e *FieldError) Unwrap() []error { return []error{hypervisor.ErrInvalidArgument, e.Err} }

// Fieldf returns a *FieldError for field with a formatted message.
func Fieldf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// Within prefixes the field of err, a *FieldError, with parent ("vms[1]"
// and "name" give "vms[1].name"); any other error becomes a *FieldError for
// parent. It keeps nil nil.
func Within(parent string, err error) error {
	if err == nil {
		return nil
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		return &FieldError{Field: parent, Err: err}
	}
	field := parent
	switch {
	case fe.Field == "":
	case parent == "" || strings.HasPrefix(fe.Field, "["):
		field = parent + fe.Field
	default:
		field = parent + "." + fe.Field
	}
	return &FieldError{Field: field, Err: fe.Err}
}

// Invalid marks err as refused input: errors.Is(err,
// hypervisor.ErrInvalidArgument) holds, and the text is err's own.
func Invalid(err error) error {
	if err == nil || errors.Is(err, hypervisor.ErrInvalidArgument) {
		return err
	}
	return &FieldError{Err: err}
}

// Duration is a time.Duration written as a Go duration string ("90s",
// "10m", "1h30m") in settings, YAML and JSON alike; it must be positive.
// The zero value means "the driver's default" and is left out of JSON
// (fields are tagged omitempty).
type Duration time.Duration

// ParseDuration reads a Go duration string that must be positive: the one
// way driver settings read a duration.
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	return d, nil
}

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText writes d as "1m30s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a positive Go duration string (see ParseDuration).
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
