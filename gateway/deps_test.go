package gateway_test

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

// TestServiceFloor keeps the gateway a room of handlers over the service
// floor (issue 35): its own files import neither the providers, billing,
// termination nor Redis, and the store only for reads.
func TestServiceFloor(t *testing.T) {
	forbidden := []string{
		"github.com/sandgate/sandgate/providers",
		"github.com/sandgate/sandgate/providers/runner",
		"github.com/sandgate/sandgate/billing",
		"github.com/sandgate/sandgate/termination",
		"github.com/redis/go-redis/v9",
	}
	// The store.DB methods the gateway may call: token lookup, the
	// invalidation subscription and listing.
	reads := []string{"AuthByTokenHash", "Subscribe", "ListWorkspaces"}

	p, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range p.Imports { // of the non-test files
		if slices.Contains(forbidden, path) {
			t.Errorf("gateway imports %s; it reaches it only through package saga", path)
		}
	}
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			var onDB bool
			switch x := sel.X.(type) {
			case *ast.Ident: // db.M, a *store.DB parameter
				onDB = x.Name == "db"
			case *ast.SelectorExpr: // s.db.M
				onDB = x.Sel.Name == "db"
			}
			if onDB && !slices.Contains(reads, sel.Sel.Name) {
				t.Errorf("%s calls store.DB.%s; the gateway only reads the store (%v)", fset.Position(sel.Pos()), sel.Sel.Name, reads)
			}
			return true
		})
	}
}
