package tools

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/server/catalog"
)

// readmeArgRow is a row of README's "| tool | arguments |" table.
var readmeArgRow = regexp.MustCompile("(?m)^\\| (`[a-z_]+`(?:, `[a-z_]+`)*) \\| (.*) \\|$")

// topLevelNames are the backticked names in s outside parentheses: the
// arguments a row names (those inside describe an argument's own members).
func topLevelNames(s string) []string {
	var names []string
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case '`':
			j := strings.IndexByte(s[i+1:], '`')
			if j < 0 {
				return names
			}
			if depth == 0 {
				names = append(names, strings.TrimSuffix(s[i+1:i+1+j], "?"))
			}
			i += j + 1
		}
	}
	return names
}

// TestReadmeToolArguments: README's table of tools and their arguments
// names only arguments the tools take, and no argument for a tool that
// takes none (list_vms takes no vm).
func TestReadmeToolArguments(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*catalog.Tool{}
	for _, tool := range Catalogue(catalog.DefaultLimits()) {
		byName[tool.Name] = tool
	}
	_, table, ok := strings.Cut(string(b), "| tool | arguments |\n")
	if !ok {
		t.Fatal("README has no table of tools and arguments (| tool | arguments |)")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := readmeArgRow.FindAllStringSubmatch(table, -1)
	if len(rows) < 10 {
		t.Fatalf("README has %d rows of tools and arguments; want the table", len(rows))
	}
	for _, row := range rows {
		args := topLevelNames(row[2])
		for _, name := range topLevelNames(row[1]) {
			tool := byName[name]
			if tool == nil {
				t.Errorf("README row %q: no tool %s", row[0], name)
				continue
			}
			if len(tool.Fields) == 0 && len(args) > 0 {
				t.Errorf("README row %q: %s takes no arguments, the row names %q", row[0], name, args)
			}
		}
		for _, a := range args {
			if byName[a] != nil {
				continue // prose about a tool, not an argument
			}
			taken := false
			for _, name := range topLevelNames(row[1]) {
				taken = taken || byName[name] != nil && byName[name].Field(a) != nil
			}
			if !taken {
				t.Errorf("README row %q: no tool of the row takes %q", row[0], a)
			}
		}
	}
}
