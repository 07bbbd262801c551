package catalog

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// Typed arguments. Each tool declares a struct whose fields carry `arg`
// tags naming its catalogue fields. newTool checks, when the catalogue is
// built, that the struct and the field list agree (every field has a
// struct field of its kind, and nothing more), and the gate decodes the
// validated arguments into a fresh struct once (Tool.Decode), so a
// handler reads a.PID, never c.args["pid"].
//
// Field kind → Go type: string → string or *string; integer → int64 or
// *int64; boolean → bool or *bool; string array → []string; string map →
// map[string]string; object → a struct or *struct described the same way.
// A pointer is nil when the argument was not given: use one where "given"
// matters (an empty shell is still a shell; wait defaults to true). The
// top-level vm field is the gate's own (it becomes Call.VM and
// Call.Driver), so argument structs do not repeat it.

// argPlan maps the fields of one object to the fields of its struct type.
type argPlan struct {
	typ   reflect.Type
	slots []argSlot
}

// argSlot is one argument and the struct field it fills.
type argSlot struct {
	name  string
	index int // of the struct field
	kind  Kind
	ptr   bool     // the struct field is a pointer to the value
	sub   *argPlan // objects: the plan of the nested struct
}

// errArgPlan: an argument struct that does not match its fields (a
// programming error in the catalogue).
var errArgPlan = errors.New("argument struct does not match the catalogue")

// planArgs builds the plan that fills a value of struct type t from fields.
// top says t holds a tool's arguments, whose vm field the gate consumes.
func planArgs(t reflect.Type, fields []Field, top bool) (*argPlan, error) {
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("%w: %s is not a struct", errArgPlan, t)
	}
	byTag := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("arg")
		if tag == "" {
			return nil, fmt.Errorf("%w: %s.%s has no arg tag", errArgPlan, t, t.Field(i).Name)
		}
		byTag[tag] = i
	}
	p := &argPlan{typ: t}
	for i := range fields {
		f := &fields[i]
		if top && f.Name == "vm" {
			continue
		}
		idx, ok := byTag[f.Name]
		if !ok {
			return nil, fmt.Errorf("%w: %s has no field for argument %q", errArgPlan, t, f.Name)
		}
		delete(byTag, f.Name)
		slot, err := planSlot(t.Field(idx), idx, f)
		if err != nil {
			return nil, err
		}
		p.slots = append(p.slots, slot)
	}
	if len(byTag) > 0 {
		extra := slices.Sorted(maps.Keys(byTag))
		return nil, fmt.Errorf("%w: %s has a field for %q, which is no argument", errArgPlan, t, extra[0])
	}
	return p, nil
}

func planSlot(sf reflect.StructField, idx int, f *Field) (argSlot, error) {
	slot := argSlot{name: f.Name, index: idx, kind: f.Kind}
	ft := sf.Type
	if ft.Kind() == reflect.Pointer {
		slot.ptr, ft = true, ft.Elem()
	}
	var ok bool
	switch f.Kind {
	case KindString:
		ok = ft.Kind() == reflect.String
	case KindInteger:
		ok = ft.Kind() == reflect.Int64
	case KindBoolean:
		ok = ft.Kind() == reflect.Bool
	case KindStringArray:
		ok = !slot.ptr && ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.String
	case KindStringMap:
		ok = !slot.ptr && ft.Kind() == reflect.Map && ft.Key().Kind() == reflect.String && ft.Elem().Kind() == reflect.String
	case KindObject:
		sub, err := planArgs(ft, f.Fields, false)
		if err != nil {
			return slot, err
		}
		slot.sub, ok = sub, true
	}
	if !ok {
		return slot, fmt.Errorf("%w: field %s (%s) cannot hold argument %q", errArgPlan, sf.Name, sf.Type, f.Name)
	}
	return slot, nil
}

// fill sets dst (a struct of p.typ) from valid, the output of
// Tool.Validate for the same fields.
func (p *argPlan) fill(valid map[string]any, dst reflect.Value) error {
	for i := range p.slots {
		sl := &p.slots[i]
		v, ok := valid[sl.name]
		if !ok {
			continue
		}
		fv := dst.Field(sl.index)
		if sl.ptr {
			n := reflect.New(fv.Type().Elem())
			fv.Set(n)
			fv = n.Elem()
		}
		if err := sl.set(fv, v); err != nil {
			return fmt.Errorf("%s: %w", sl.name, err)
		}
	}
	return nil
}

// errArgType: a validated argument of another type than its field's kind.
var errArgType = errors.New("validated argument of an unexpected type")

func (sl *argSlot) set(fv reflect.Value, v any) error {
	switch sl.kind {
	case KindString:
		if s, ok := v.(string); ok {
			fv.SetString(s)
			return nil
		}
	case KindInteger:
		if n, ok := v.(int64); ok {
			fv.SetInt(n)
			return nil
		}
	case KindBoolean:
		if b, ok := v.(bool); ok {
			fv.SetBool(b)
			return nil
		}
	case KindStringArray:
		if a, ok := v.([]any); ok {
			return setStrings(fv, a)
		}
	case KindStringMap:
		if m, ok := v.(map[string]any); ok {
			return setStringMap(fv, m)
		}
	case KindObject:
		if m, ok := v.(map[string]any); ok {
			return sl.sub.fill(m, fv)
		}
	}
	return fmt.Errorf("%w: %T", errArgType, v)
}

func setStrings(fv reflect.Value, a []any) error {
	out := reflect.MakeSlice(fv.Type(), len(a), len(a))
	for i, e := range a {
		s, ok := e.(string)
		if !ok {
			return fmt.Errorf("%w: [%d] is %T", errArgType, i, e)
		}
		out.Index(i).SetString(s)
	}
	fv.Set(out)
	return nil
}

func setStringMap(fv reflect.Value, m map[string]any) error {
	t := fv.Type()
	out := reflect.MakeMapWithSize(t, len(m))
	for k, e := range m {
		s, ok := e.(string)
		if !ok {
			return fmt.Errorf("%w: .%s is %T", errArgType, k, e)
		}
		out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), reflect.ValueOf(s).Convert(t.Elem()))
	}
	fv.Set(out)
	return nil
}

// A Handler runs one call of a tool: with the server's shared state (Env),
// the call as the gate let it through (Call) and its typed arguments.
type Handler[A any] func(e *Env, c *Call, a *A) Result

// NewTool completes t with its argument struct A and its handler: the
// gate decodes t's validated arguments into a new A, and run gets it. A
// struct that does not match t.Fields panics (a programming error, caught
// by every test that builds the catalogue).
func NewTool[A any](t Tool, run Handler[A]) *Tool {
	plan, err := planArgs(reflect.TypeFor[A](), t.Fields, true)
	if err != nil {
		panic(fmt.Sprintf("server: catalogue: %s: %v", t.Name, err))
	}
	t.plan = plan
	t.run = func(e *Env, c *Call) Result { return run(e, c, c.Args.(*A)) }
	return &t
}

// Decode turns validated arguments into the tool's argument struct (a
// pointer to it, as the handler gets it).
func (t *Tool) Decode(valid map[string]any) (any, error) {
	v := reflect.New(t.plan.typ)
	if err := t.plan.fill(valid, v.Elem()); err != nil {
		return nil, fmt.Errorf("server: decode arguments of %s: %w", t.Name, err)
	}
	return v.Interface(), nil
}

// Run runs c (whose Args Decode made) through t's handler.
func (t *Tool) Run(e *Env, c *Call) Result { return t.run(e, c) }

// NoArgs is the argument struct of a tool whose only argument, if any, is vm.
type NoArgs struct{}
