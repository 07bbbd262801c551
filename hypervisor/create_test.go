package hypervisor

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCreateRequestValidate(t *testing.T) {
	ok := CreateRequest{Name: "small-x7k2", Source: json.RawMessage(`{}`), MemoryMB: 256, CPUs: 1, Mark: "ABCDEFGH234567"}
	tests := []struct {
		name string
		edit func(*CreateRequest)
		ok   bool
	}{
		{"ok", func(*CreateRequest) {}, true},
		{"zero sizes mean the driver's defaults", func(r *CreateRequest) { r.MemoryMB, r.CPUs = 0, 0 }, true},
		{"upper case name", func(r *CreateRequest) { r.Name = "Small" }, false},
		{"name with a slash", func(r *CreateRequest) { r.Name = "a/b" }, false},
		{"name with dots", func(r *CreateRequest) { r.Name = ".." }, false},
		{"name starting with a dash", func(r *CreateRequest) { r.Name = "-rf" }, false},
		{"long name", func(r *CreateRequest) { r.Name = strings.Repeat("a", 64) }, false},
		{"negative memory", func(r *CreateRequest) { r.MemoryMB = -1 }, false},
		{"huge memory", func(r *CreateRequest) { r.MemoryMB = MaxCreateMemoryMB + 1 }, false},
		{"too many cpus", func(r *CreateRequest) { r.CPUs = MaxCreateCPUs + 1 }, false},
		{"short mark", func(r *CreateRequest) { r.Mark = "abc" }, false},
		{"mark with markup", func(r *CreateRequest) { r.Mark = `abcdefgh"/><x` }, false},
		{"mark with a newline", func(r *CreateRequest) { r.Mark = "abcdefgh\nx" }, false},
		{"huge source", func(r *CreateRequest) { r.Source = json.RawMessage(`{"a":"` + strings.Repeat("x", 70000) + `"}`) }, false},
	}
	for _, tt := range tests {
		r := ok
		tt.edit(&r)
		err := r.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("Validate(%s) = %v; want ok %v (else ErrInvalidArgument)", tt.name, err, tt.ok)
		}
	}
	for _, d := range []DeleteRequest{{Name: "", Mark: "ABCDEFGH"}, {Name: "x", Mark: ""}, {Name: strings.Repeat("x", 256), Mark: "ABCDEFGH"}} {
		if err := d.Validate(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("DeleteRequest%+v.Validate() = %v; want ErrInvalidArgument", d, err)
		}
	}
	if err := (DeleteRequest{Name: "101", Mark: "ABCDEFGH"}).Validate(); err != nil {
		t.Errorf("DeleteRequest{101}.Validate() = %v; want nil", err)
	}
}

func TestDecodeSource(t *testing.T) {
	type src struct {
		Domain string `json:"domain"`
	}
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"domain":"base"}`, "base", true},
		{``, "", true},
		{`{}`, "", true},
		{`{"domian":"base"}`, "", false},
		{`{"domain":"a"} {"domain":"b"}`, "", false},
		{`[1]`, "", false},
		{`{"domain":5}`, "", false},
	}
	for _, tt := range tests {
		var s src
		err := DecodeSource(json.RawMessage(tt.in), &s)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) || (tt.ok && s.Domain != tt.want) {
			t.Errorf("DecodeSource(%s) = %+v, %v; want %q ok %v", tt.in, s, err, tt.want, tt.ok)
		}
	}
}
