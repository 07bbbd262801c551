package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// testSettings are the settings of the test driver "fake-reg".
type testSettings struct {
	Name    string   `json:"name"`
	Timeout Duration `json:"timeout,omitempty"`
	Items   []struct {
		ID string `json:"id"`
	} `json:"items,omitempty"`
}

func (s *testSettings) Validate() error {
	if s.Name == "" {
		return Fieldf("name", "required")
	}
	for i, it := range s.Items {
		if it.ID == "" {
			return Within("items", Within(fmt.Sprintf("[%d]", i), Fieldf("id", "required")))
		}
	}
	return nil
}

var built []*testSettings

func init() {
	Register("fake-reg", func(_ context.Context, s *testSettings) (hypervisor.Driver, error) {
		built = append(built, s)
		return &hypervisortest.Fake{}, nil
	})
}

func TestLookupAndNames(t *testing.T) {
	d, ok := Lookup("fake-reg")
	if !ok || d.Name() != "fake-reg" {
		t.Fatalf("Lookup(fake-reg) = %+v, %v; want the driver", d, ok)
	}
	if _, ok := d.Settings().(*testSettings); !ok {
		t.Errorf("Settings() = %T; want *testSettings", d.Settings())
	}
	if _, ok := Lookup("nope"); ok {
		t.Errorf("Lookup(nope) found a driver")
	}
	if drv, err := New(context.Background(), "nope", nil); drv != nil || !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("New(nope) = %v, %v; want no driver and %v", drv, err, hypervisor.ErrInvalidArgument)
	}
	if drv, err := New(context.Background(), "fake-reg", []byte(`{"name":"x"}`)); drv == nil || err != nil {
		t.Errorf("New(fake-reg) = %v, %v; want the driver", drv, err)
	}
	if !slices.Contains(Names(), "fake-reg") || !slices.IsSorted(Names()) {
		t.Errorf("Names() = %v; want it sorted, with fake-reg", Names())
	}
}

func TestRegisterPanics(t *testing.T) {
	build := func(context.Context, *testSettings) (hypervisor.Driver, error) { return nil, nil }
	for _, tt := range []struct {
		name string
		do   func()
	}{
		{"taken name", func() { Register("fake-reg", build) }},
		{"bad name", func() { Register("Bad/Name", build) }},
		{"empty name", func() { Register("", build) }},
		{"no constructor", func() { Register[testSettings, *testSettings, *hypervisortest.Fake]("fake-nil", nil) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%s) did not panic", tt.name)
				}
			}()
			tt.do()
		}()
	}
	if _, ok := Lookup("fake-nil"); ok {
		t.Errorf("a refused Register left driver fake-nil registered")
	}
}

func init() {
	Register("fake-typed-nil", func(context.Context, *testSettings) (*hypervisortest.Fake, error) { return nil, nil })
}

// TestTypedNilConstructor: a constructor returning a nil *T without an
// error is refused, not served as a driver.
func TestTypedNilConstructor(t *testing.T) {
	d, _ := Lookup("fake-typed-nil")
	if drv, err := d.New(context.Background(), []byte(`{"name":"a"}`)); err == nil || drv != nil {
		t.Errorf("New() = %#v, %v; want no driver and an error", drv, err)
	}
}

func TestNew(t *testing.T) {
	d, _ := Lookup("fake-reg")
	built = nil
	drv, err := d.New(context.Background(), []byte(`{"name":"a","timeout":"1m30s","items":[{"id":"x"}]}`))
	if err != nil || drv == nil || len(built) != 1 {
		t.Fatalf("New(good) = %v, %v (built %d); want a driver", drv, err, len(built))
	}
	if got := built[0]; got.Name != "a" || got.Timeout.D() != 90*time.Second || len(got.Items) != 1 {
		t.Errorf("constructor saw %+v; want name a, timeout 1m30s, one item", got)
	}
	bad := []struct{ config, want string }{
		{``, "fake-reg: config: name: required"},
		{`{}`, "fake-reg: config: name: required"},
		{`{"name":"a","items":[{"id":""}]}`, "fake-reg: config: items[0].id: required"},
		{`{"name":"a","nme":"b"}`, `unknown field "nme"`},
		{`{"name":"a","name":"b"}`, "name: defined twice"},
		{`{"name":"a","items":[{"id":"x","id":"y"}]}`, "items[0].id: defined twice"},
		// encoding/json matches a field in any case: two spellings of one
		// key would reach the driver as one, so the strict lexer refuses
		// them.
		{`{"name":"a","Name":"b"}`, `key "Name" differs from key "name" only in case`},
		{`{"name":"a","items":[{"id":"x","ID":"y"}]}`, `items[0]: key "ID" differs from key "id" only in case`},
		{"{\"name\":\"a\xff\"}", "UTF-8"},
		{`{"name":"a"} {}`, "trailing data"},
		{`{"name":"a"}x`, "trailing data"},
		{`[{"name":"a"}]`, "want a JSON object"},
		{`null`, "want a JSON object"},
		{`{"name":"a","timeout":"soon"}`, `invalid duration "soon"`},
		{`{"name":"a","timeout":"-1s"}`, `"-1s" must be positive`},
		{`{"name":"a","timeout":"0s"}`, `"0s" must be positive`},
		{`{"name":"a","timeout":90}`, "timeout"},
		{`{"name":"a"`, "unexpected EOF"},
	}
	for _, tt := range bad {
		built = nil
		drv, err := d.New(context.Background(), []byte(tt.config))
		if !errors.Is(err, hypervisor.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%s) = %v, %v; want %v containing %q", tt.config, drv, err, hypervisor.ErrInvalidArgument, tt.want)
		}
		if len(built) != 0 {
			t.Errorf("New(%s) reached the constructor; want it refused before", tt.config)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	var s testSettings
	if err := json.Unmarshal([]byte(`{"name":"a","timeout":"2h"}`), &s); err != nil || s.Timeout.D() != 2*time.Hour {
		t.Fatalf("Unmarshal(2h) = %v, %v; want 2h", s.Timeout.D(), err)
	}
	out, err := json.Marshal(s)
	if err != nil || string(out) != `{"name":"a","timeout":"2h0m0s"}` {
		t.Errorf("Marshal(%+v) = %s, %v", s, out, err)
	}
	out, _ = json.Marshal(testSettings{Name: "a"})
	if string(out) != `{"name":"a"}` {
		t.Errorf("Marshal(zero timeout) = %s; want the timeout left out", out)
	}
	for _, in := range []string{"", "10", "1x", "-5m", "0"} {
		if d, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, nil; want an error", in, d)
		}
	}
}

func TestWithin(t *testing.T) {
	tests := []struct {
		parent string
		err    error
		want   string
	}{
		{"vms[1]", Fieldf("name", "bad"), "vms[1].name: bad"},
		{"vms", Fieldf("[1]", "bad"), "vms[1]: bad"},
		{"uri", errors.New("bad"), "uri: bad"},
		{"uri", Fieldf("", "bad"), "uri: bad"},
		{"", Fieldf("name", "bad"), "name: bad"},
	}
	for _, tt := range tests {
		got := Within(tt.parent, tt.err)
		if got.Error() != tt.want || !errors.Is(got, hypervisor.ErrInvalidArgument) {
			t.Errorf("Within(%q, %v) = %v; want %q matching ErrInvalidArgument", tt.parent, tt.err, got, tt.want)
		}
	}
	if Within("x", nil) != nil {
		t.Errorf("Within(x, nil) != nil")
	}
	if err := Invalid(errors.New("plain")); !errors.Is(err, hypervisor.ErrInvalidArgument) || err.Error() != "plain" {
		t.Errorf("Invalid(plain) = %v; want the same text matching ErrInvalidArgument", err)
	}
}
