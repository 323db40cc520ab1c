package residentd

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The resident starts before the broker's packages are initialised only
// while it imports nothing that the linker schedules after them (see the
// package doc): each package here must be among those the broker's first
// initialisations include.
func TestImportsStartEarly(t *testing.T) {
	early := map[string]bool{"errors": true, "os": true, "runtime": true, "sync": true, "syscall": true, "unsafe": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !early[path] {
				t.Errorf("%s imports %s, whose initialisation would hold up every resident's start; allowed: errors, os, runtime, sync, syscall, unsafe", f, path)
			}
		}
	}
}
