package sandgate_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type goPackage struct {
	ImportPath string
	Doc        string
	Imports    []string
	Standard   bool
	Name       string
}

func listPackages(t *testing.T) []goPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

const module = "github.com/sandgate/sandgate"

// TestPackageDocs keeps every package documented, in tailscale's pkgdoc style.
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no doc comment", p.ImportPath)
		}
	}
}

// TestDependencyFloors keeps DESIGN.md's arrows one-way: the root package
// imports only the standard library, protocol imports nothing of ours, and
// only cmd (and test helpers under internal/) import gateway, and nothing
// imports cmd.
func TestDependencyFloors(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			own := strings.HasPrefix(imp, module)
			switch {
			case p.ImportPath == module && (own || strings.Contains(strings.SplitN(imp, "/", 2)[0], ".")):
				t.Errorf("root package imports %s; want the standard library only", imp)
			case p.ImportPath == module+"/protocol" && own:
				t.Errorf("protocol imports %s; want a leaf", imp)
			case (imp == module+"/gateway" && !strings.HasPrefix(p.ImportPath, module+"/cmd") && !strings.HasPrefix(p.ImportPath, module+"/internal/")) || strings.HasPrefix(imp, module+"/cmd"):
				t.Errorf("%s imports %s; only cmd may import gateway, and nothing cmd", p.ImportPath, imp)
			}
		}
	}
}

// wiringConstructors are the constructors of the broker's shared parts:
// only cmd/sandgate (the one wiring place) and test helpers under
// internal/ call them, so no room builds a second billing, admission
// pipeline, terminator or saga of its own (DESIGN.md "One wiring place").
var wiringConstructors = map[string][]string{
	module + "/admission":   {"New", "Standard", "NewLimiter", "NewControlCache"},
	module + "/billing":     {"New"},
	module + "/termination": {"New"},
	module + "/saga":        {"New"},
	module + "/store":       {"New"},
	module + "/gateway":     {"New"},
	module + "/admin":       {"New"},
	module + "/reaper":      {"New"},
	module + "/egress":      {"New"},
	module + "/telemetry":   {"NewTracing", "Providers", "Admission", "Settlement", "LiveWorkspaces"},
}

// TestOneWiringPlace parses every non-test file of every package but cmd
// and internal/ and fails on a call of a wiring constructor.
func TestOneWiringPlace(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 3 || strings.HasPrefix(f[0], module+"/cmd") || strings.HasPrefix(f[0], module+"/internal/") {
			continue
		}
		for _, name := range strings.Fields(f[2]) {
			file, err := parser.ParseFile(fset, filepath.Join(f[1], name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			imports := map[string]string{} // local name → import path
			for _, im := range file.Imports {
				p := strings.Trim(im.Path.Value, `"`)
				local := p[strings.LastIndex(p, "/")+1:]
				if im.Name != nil {
					local = im.Name.Name
				}
				imports[local] = p
			}
			ast.Inspect(file, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				if slices.Contains(wiringConstructors[imports[id.Name]], sel.Sel.Name) {
					t.Errorf("%s: %s calls %s.%s; only cmd/sandgate wires the broker", fset.Position(call.Pos()), f[0], id.Name, sel.Sel.Name)
				}
				return true
			})
		}
	}
}
