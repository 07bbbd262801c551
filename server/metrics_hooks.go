package server

// ToolNames returns the names of every tool of the catalogue, in catalogue
// order: the closed set of tool label values server/metrics counts by (a
// name outside it is counted as "other").
func ToolNames() []string {
	specs := catalogue(DefaultLimits)
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.name
	}
	return names
}
