package proxmox

import (
	"bufio"
	"fmt"
	"strings"
)

// --- a tiny txtar reader and writer (golang.org/x/tools/txtar is not a dependency) ---

type txtarFile struct {
	Name string
	Data string
}

func parseTxtar(data string) []txtarFile {
	var files []txtarFile
	var cur *txtarFile
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-- ") && strings.HasSuffix(line, " --") && len(line) > 6 {
			files = append(files, txtarFile{Name: strings.TrimSpace(line[3 : len(line)-3])})
			cur = &files[len(files)-1]
			continue
		}
		if cur != nil {
			cur.Data += line + "\n"
		}
	}
	return files
}

func formatTxtar(comment string, files []txtarFile) string {
	var sb strings.Builder
	sb.WriteString(comment)
	for _, f := range files {
		fmt.Fprintf(&sb, "-- %s --\n%s", f.Name, f.Data)
		if !strings.HasSuffix(f.Data, "\n") {
			sb.WriteString("\n")
		}
	}
	return sb.String()
}
