package sandgate_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
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
