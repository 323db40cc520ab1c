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
// imports only the standard library, protocol imports nothing of ours,
// only internal/ (the broker and test helpers) imports gateway, and
// nothing imports cmd.
func TestDependencyFloors(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			own := strings.HasPrefix(imp, module)
			switch {
			case p.ImportPath == module && (own || strings.Contains(strings.SplitN(imp, "/", 2)[0], ".")):
				t.Errorf("root package imports %s; want the standard library only", imp)
			case p.ImportPath == module+"/protocol" && own:
				t.Errorf("protocol imports %s; want a leaf", imp)
			case (imp == module+"/gateway" && !strings.HasPrefix(p.ImportPath, module+"/internal/") && !slices.Contains(tools, p.ImportPath)) || strings.HasPrefix(imp, module+"/cmd"):
				t.Errorf("%s imports %s; only internal/broker may import gateway, and nothing cmd", p.ImportPath, imp)
			}
		}
	}
}

// wiringConstructors are the constructors of the broker's shared parts:
// only internal/broker (the one wiring place) calls them, so no room
// builds a second billing, admission pipeline, terminator or saga of its
// own, and the tests build the same broker (DESIGN.md "One wiring place").
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
	module + "/stripesync":  {"New"},
	module + "/telemetry":   {"NewTracing", "Providers", "Admission", "Settlement", "LiveWorkspaces"},
}

// tools are the commands that are not shipped (the Dockerfile builds the
// broker and its guest agent alone): measuring tools, which seed Redis and
// build the parts they measure as tests do.
var tools = []string{module + "/cmd/sandgate-load"}

// shipped are the commands that are shipped.
var shipped = []string{"./cmd/sandgate", "./cmd/sandgate-guest"}

// wiringExempt are the packages besides internal/broker whose non-test
// files may call a wiring constructor: the tools, and the test helpers
// other than sgtest, which build stores and proxies of their own.
var wiringExempt = []string{
	module + "/internal/broker",
	module + "/cmd/sandgate-load",
	module + "/internal/egresstest",
	module + "/internal/fakeprovider",
	module + "/internal/redistest",
	module + "/internal/testpki",
}

// TestOneWiringPlace parses every non-test file of every package but
// internal/broker and fails on a call of a wiring constructor; so
// internal/sgtest holds no copy of the wiring.
func TestOneWiringPlace(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 3 || slices.Contains(wiringExempt, f[0]) {
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
					t.Errorf("%s: %s calls %s.%s; only internal/broker wires the broker", fset.Position(call.Pos()), f[0], id.Name, sel.Sel.Name)
				}
				return true
			})
		}
	}
}

// providerKinds are the provider kind packages: only internal/broker
// (its table of kinds) and tests import them.
var providerKinds = []string{
	module + "/providers/local",
	module + "/providers/modal",
	module + "/providers/flymachines",
	module + "/providers/flysprites",
	module + "/providers/noop",
}

// testHelper reports whether import path p is a test helper: a package
// under internal/ but the broker, or one named *test.
func testHelper(p string) bool {
	if !strings.HasPrefix(p, module+"/") {
		return false
	}
	return slices.Contains(testHelpers, strings.TrimPrefix(p, module+"/")) || strings.HasSuffix(p, "test")
}

// testHelpers are the packages under internal/ that only tests use; the
// others there (broker, livecache) are parts of the broker.
var testHelpers = []string{"internal/sgtest", "internal/redistest", "internal/fakeprovider", "internal/egresstest", "internal/testpki", "internal/tally", "internal/stripemock", "internal/logbuf"}

// TestImports keeps the rooms' doors where DESIGN.md puts them: the CLI
// talks to the operator API through its client, not the server; only the
// broker picks provider kinds; the gateway reaches state and providers
// through the service floor; the console only through the operator API.
func TestImports(t *testing.T) {
	type rule struct {
		pkg    string   // the importer
		banned []string // its direct imports may include none of these
		why    string
	}
	rules := []rule{
		{module + "/cmd/sandgate", []string{module + "/admin"}, "the CLI talks to the operator API through adminapi"},
		{module + "/gateway", []string{module + "/providers", module + "/providers/runner", module + "/billing", module + "/termination", "github.com/redis/go-redis/v9"},
			"the gateway reaches providers and state through the service floor"},
	}
	for _, p := range listPackages(t) {
		for _, r := range rules {
			if p.ImportPath != r.pkg {
				continue
			}
			for _, imp := range p.Imports {
				if slices.Contains(r.banned, imp) {
					t.Errorf("%s imports %s; %s", p.ImportPath, imp, r.why)
				}
			}
		}
		if p.ImportPath == module+"/internal/broker" || testHelper(p.ImportPath) || slices.Contains(tools, p.ImportPath) {
			continue
		}
		for _, imp := range p.Imports {
			if slices.Contains(providerKinds, imp) {
				t.Errorf("%s imports the provider kind %s; only internal/broker picks provider kinds", p.ImportPath, imp)
			}
		}
	}
}

// testOnly are modules' packages only tests may link: their package init
// runs at every start of a binary that links them, and the broker's
// binary starts often (each CLI command, each durable command's step).
var testOnly = []string{
	"github.com/santhosh-tekuri/jsonschema/v6", // its meta-schemas, about 4 ms of CPU
}

// TestBinaryDeps keeps test helpers and test-only modules out of the
// shipped binaries, and the operator API's server out of the console.
func TestBinaryDeps(t *testing.T) {
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, shipped...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if testHelper(p) {
			t.Errorf("a shipped binary depends on the test helper %s", p)
		}
		if slices.Contains(testOnly, p) {
			t.Errorf("a shipped binary depends on %s, which only tests need", p)
		}
	}
	out, err = exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./console").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if slices.Contains(strings.Fields(string(out)), module+"/admin") {
		t.Errorf("console depends on %s; it reads and acts through adminapi", module+"/admin")
	}
}
