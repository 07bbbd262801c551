package server

// ToolFacts is what offline tools (`vmgate policy suggest`) need to know
// of a tool of the catalogue.
type ToolFacts struct {
	Name        string
	Args        []string // its argument names, in catalogue order
	Destructive bool     // it can change a guest (its annotations say so)
	ReadOnly    bool
}

// Catalogue returns the facts of every tool of the catalogue, in
// catalogue order.
func Catalogue() []ToolFacts {
	specs := catalogue(DefaultLimits)
	out := make([]ToolFacts, len(specs))
	for i, s := range specs {
		f := ToolFacts{Name: s.name, Destructive: s.destructive, ReadOnly: s.readOnly}
		for _, fl := range s.fields {
			f.Args = append(f.Args, fl.name)
		}
		out[i] = f
	}
	return out
}
