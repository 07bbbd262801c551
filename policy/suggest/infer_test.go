package suggest

import (
	"encoding/json"
	"path"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestVolatileAndShapes(t *testing.T) {
	tests := []struct {
		in, glob, regex string
		stable          bool
	}{
		{"lab/vm1", "lab/vm1", `lab/vm1`, true},
		{"lab/e2e", "lab/e2e", `lab/e2e`, true},
		{"/tmp/vmgate-e2e-agent-4711.bin", "/tmp/vmgate-e2e-agent-*.bin", `/tmp/vmgate-e2e-agent-[0-9]+\.bin`, false},
		{"/var/lib/vmgate/sessions/0a1b2c3d4e5f60718293a4b5c6d7e8f9/vmgate-e2e-agent-99.junk", "/var/lib/vmgate/sessions/*/vmgate-e2e-agent-*.junk",
			`/var/lib/vmgate/sessions/[0-9a-f]{32}/vmgate-e2e-agent-[0-9]+\.junk`, false},
		{"XK3JQ2M7PLA4ZB6TQ5RE3WNY7H", "*", `[0-9A-Z]{26}`, false}, // rand.Text
		{"xK3JQ2M7PLA4ZB6TQ5RE3WNY7H", "*", `[0-9A-Za-z]{26}`, false},
		{"2026-07-01", "*-*-*", `[0-9]+-[0-9]+-[0-9]+`, false},
		{"python3", "python3", `python3`, true},
		{"authorization", "authorization", `authorization`, true},
		{"echo oops >&2; exit 3", "echo oops >&2; exit 3", `echo oops >&2; exit 3`, true}, // free text is itself
		{"a*b?c[d]\\", `a\*b\?c\[d]\\`, `a\*b\?c\[d\]\\`, true},
		{"/etc/hostname", "/etc/hostname", `/etc/hostname`, true},
	}
	for _, tt := range tests {
		sh := shapeOf(tt.in)
		if got := sh.glob(); got != tt.glob {
			t.Errorf("shapeOf(%q).glob() = %q; want %q", tt.in, got, tt.glob)
		}
		if got := sh.regex(); got != tt.regex {
			t.Errorf("shapeOf(%q).regex() = %q; want %q", tt.in, got, tt.regex)
		}
		if got := stable(tt.in); got != tt.stable {
			t.Errorf("stable(%q) = %v; want %v", tt.in, got, tt.stable)
		}
		if m, err := path.Match(tt.glob, tt.in); !hasSpace(tt.in) && (err != nil || !m) {
			t.Errorf("path.Match(%q, %q) = %v, %v; want the shape to match its value", tt.glob, tt.in, m, err)
		}
		if re := regexp.MustCompile("^(?:" + tt.regex + ")$"); !re.MatchString(tt.in) {
			t.Errorf("regex %s does not match %q", re, tt.in)
		}
	}
	// Shapes with the same literals are one, their tokens widened.
	a, b := shapeOf("s-0a1b2c3d4e5f6071"), shapeOf("s-99887766554433221100")
	if a.key() != b.key() {
		t.Fatalf("keys %q and %q differ; want one shape", a.key(), b.key())
	}
	if got := a.widen(b).regex(); got != `s-[0-9a-f]{16,20}` {
		t.Errorf("widened regex = %q; want s-[0-9a-f]{16,20}", got)
	}
}

// conds renders conditions as "path op value" strings.
func conds(cs []condition) []string {
	var out []string
	for _, c := range cs {
		s := c.Path + " " + c.Op
		if c.Value != nil {
			b, _ := json.Marshal(c.Value)
			s += " " + string(b)
		}
		out = append(out, s)
	}
	return out
}

// TestConditions: the narrowest condition for the values one path took,
// in require when every call sent it, negated in deny_if when not.
func TestConditions(t *testing.T) {
	strs := func(p string, vs ...string) *facts { return &facts{path: p, present: len(vs), strs: vs} }
	nums := func(p string, vs ...float64) *facts { return &facts{path: p, present: len(vs), nums: vs} }
	pids := []string{"/tmp/job-4711.log", "/tmp/job-4712.log", "/tmp/job-80.log"}
	var manyDirs, manyShapes []string
	for _, d := range []string{"a", "b", "c", "d", "e"} {
		for _, f := range []string{"x", "y", "z", "w"} {
			manyDirs = append(manyDirs, "/srv/"+d+"/"+f)
			manyShapes = append(manyShapes, "/srv/"+d+f+"/x/"+f+d)
		}
	}
	tests := []struct {
		name        string
		f           *facts
		total       int
		req, denyIf []string
		note        string
	}{
		{"small stable set", strs("args.signal", "TERM", "TERM", "KILL"), 3, []string{`args.signal in ["KILL","TERM"]`}, nil, ""},
		{"optional set", strs("args.cwd", "/srv", "/tmp"), 5, nil, []string{`args.cwd not_in ["/srv","/tmp"]`}, ""},
		{"one shape", strs("args.path", pids...), 3, []string{`args.path glob "/tmp/job-*.log"`}, nil, ""},
		{"two shapes", strs("args.path", "/tmp/a-1.bin", "/var/lib/s/0a1b2c3d4e5f60718293a4b5c6d7e8f9/j-2.junk"), 2,
			[]string{`args.path regex "^(?:/tmp/a-[0-9]+\\.bin|/var/lib/s/[0-9a-f]{32}/j-[0-9]+\\.junk)$"`}, nil, ""},
		{"optional path", strs("args.cwd", pids...), 5, nil, []string{`args.cwd not_glob "/tmp/job-*.log"`}, ""},
		{"paths of ids only", strs("args.p", "12/34", "56/7"), 2, nil, nil,
			"args.p: 2 different values in 2 calls, shaped with their numbers and ids as patterns: every value is an id that changes"},
		{"many files in few dirs", strs("args.path", manyDirs...), 20, []string{`args.path regex "^(?:/srv/a/[^/]*|/srv/b/[^/]*|/srv/c/[^/]*|/srv/d/[^/]*|/srv/e/[^/]*)$"`}, nil, ""},
		{"too varied", strs("args.path", manyShapes...), 20, nil, nil, "args.path: 20 different values in 20 calls, with more shapes than 8: too varied for a condition"},
		{"optional id", strs("args.session", "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "1a1b2c3d4e5f60718293a4b5c6d7e8f9"), 4, nil,
			[]string{`args.session not_regex "^(?:[0-9a-f]{32})$"`}, ""},
		{"ids", strs("args.exec_id", "xK3JQ2M7PLA4ZB6TQ5RE3WNY7H", "xA3JQ2M7PLA4ZB6TQ5RE3WNY7"), 2, []string{`args.exec_id regex "^(?:[0-9A-Za-z]{25,26})$"`}, nil, ""},
		{"programs", strs("args.command.0", "rm", "/var/lib/s/0a1b2c3d4e5f60718293a4b5c6d7e8f9/x.junk", "true"), 5, nil,
			[]string{`args.command.0 not_regex "^(?:/var/lib/s/[0-9a-f]{32}/x\\.junk|rm|true)$"`}, ""},
		{"numbers", nums("args.timeout_s", 30, 300, 30), 3, []string{"args.timeout_s gte 15", "args.timeout_s lte 600"}, nil, ""},
		{"fractions", nums("args.x", 0.5, 2.5), 2, []string{"args.x gte 0.25", "args.x lte 5"}, nil, ""},
		{"negative", nums("args.x", -4, -1), 2, []string{"args.x gte -8", "args.x lte 0"}, nil, ""},
		{"optional numbers", nums("args.idle_s", 600), 2, nil, []string{"args.idle_s lt 300", "args.idle_s gt 1200"}, ""},
		{"booleans", &facts{path: "args.wait", present: 3, bools: []bool{true, false, true}}, 3, []string{"args.wait in [false,true]"}, nil, ""},
		{"optional boolean", &facts{path: "args.memory", present: 1, bools: []bool{true}}, 2, nil, []string{"args.memory not_in [true]"}, ""},
		{"secret", &facts{path: "args.stdin", present: 2, secret: true}, 2, nil, nil, "args.stdin: only its digest is logged: no condition on its value"},
		{"list", &facts{path: "args.command", present: 2, other: 2}, 2, nil, nil, ""},
		{"mixed kinds", &facts{path: "args.x", present: 2, strs: []string{"a"}, nums: []float64{1}}, 2, nil, nil, ""},
	}
	o := Options{}
	o.fill()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, deny, note := tt.f.conditions(tt.total, &o)
			if got := conds(req); strings.Join(got, "\n") != strings.Join(tt.req, "\n") {
				t.Errorf("require = %q; want %q", got, tt.req)
			}
			if got := conds(deny); strings.Join(got, "\n") != strings.Join(tt.denyIf, "\n") {
				t.Errorf("deny_if = %q; want %q", got, tt.denyIf)
			}
			if note != tt.note {
				t.Errorf("note = %q; want %q", note, tt.note)
			}
			for _, c := range append(req, deny...) {
				if c.Why == "" {
					t.Errorf("condition %s %s has no _why", c.Path, c.Op)
				}
			}
		})
	}
}

func TestPeakRate(t *testing.T) {
	t0 := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	at := func(secs ...int) []time.Time {
		var out []time.Time
		for _, s := range secs {
			out = append(out, t0.Add(time.Duration(s)*time.Second))
		}
		return out
	}
	tests := []struct {
		times []time.Time
		peak  int
		from  int
	}{
		{at(0), 1, 0},
		{at(0, 59, 60), 2, 0},                   // 60 s apart is two windows
		{at(50, 0, 100, 110, 119, 159), 4, 100}, // unsorted in; 100..159 holds four
		{at(0, 0, 0), 3, 0},
	}
	for _, tt := range tests {
		peak, from := peakRate(tt.times, time.Minute)
		if peak != tt.peak || !from.Equal(t0.Add(time.Duration(tt.from)*time.Second)) {
			t.Errorf("peakRate(%v) = %d from %v; want %d from +%ds", tt.times, peak, from, tt.peak, tt.from)
		}
	}
}
