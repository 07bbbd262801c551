package server

// ArgsWithDefaults is args of tool with every left-out argument that has a
// default set to it (the default limits' timeout), as the server's policy
// conditions see them; args of a tool that is none come back as they are.
func ArgsWithDefaults(tool string, args map[string]any) map[string]any {
	for _, s := range catalogue(DefaultLimits) {
		if s.name == tool {
			return s.withDefaults(args)
		}
	}
	return args
}

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
