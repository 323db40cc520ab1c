package sandgate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// keyBuilder is a function (or constant) that builds a Redis key: its
// name ends in Key (or Channel) and its body holds the key prefix.
type keyBuilder struct {
	pkg, file, name string
	example         string // from "Example: …" in its doc comment
}

// keyBuilders parses every non-test Go file of the module and returns
// each key builder: a func named *Key returning one string, or a constant
// named *Key or *Channel, whose body mentions the "sg:" prefix (a string
// literal starting with it, or the identifier prefix) or calls a function
// of its package that does.
func keyBuilders(t *testing.T) []keyBuilder {
	t.Helper()
	type candidate struct {
		b    keyBuilder
		body ast.Node
	}
	var cands []candidate
	funcs := map[string]map[string]ast.Node{} // package dir → function → body
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		add := func(name string, doc *ast.CommentGroup, body ast.Node) {
			b := keyBuilder{pkg: pkg, file: filepath.Base(path), name: name}
			if doc != nil {
				if _, ex, ok := strings.Cut(doc.Text(), "Example: "); ok {
					b.example = strings.Fields(ex)[0]
				}
			}
			cands = append(cands, candidate{b, body})
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Body != nil {
					if funcs[pkg] == nil {
						funcs[pkg] = map[string]ast.Node{}
					}
					funcs[pkg][d.Name.Name] = d.Body
				}
				if d.Recv == nil && strings.HasSuffix(d.Name.Name, "Key") && d.Type.Results != nil &&
					len(d.Type.Results.List) == 1 && isString(d.Type.Results.List[0].Type) && d.Body != nil {
					add(d.Name.Name, d.Doc, d.Body)
				}
			case *ast.GenDecl:
				if d.Tok != token.CONST {
					continue
				}
				for _, spec := range d.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if (strings.HasSuffix(n.Name, "Key") || strings.HasSuffix(n.Name, "Channel")) && i < len(vs.Values) {
							doc := vs.Doc
							if doc == nil {
								doc = d.Doc
							}
							add(n.Name, doc, vs.Values[i])
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	// The functions of each package that build on the prefix, directly or
	// through another such function (billing's tag, store's instanceKey).
	builds := map[string]map[string]bool{}
	for pkg, fs := range funcs {
		builds[pkg] = map[string]bool{}
		for changed := true; changed; {
			changed = false
			for name, body := range fs {
				if !builds[pkg][name] && mentionsPrefix(body, builds[pkg]) {
					builds[pkg][name], changed = true, true
				}
			}
		}
	}
	var out []keyBuilder
	for _, c := range cands {
		if mentionsPrefix(c.body, builds[c.b.pkg]) {
			out = append(out, c.b)
		}
	}
	return out
}

func isString(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "string"
}

// mentionsPrefix reports whether n holds the key prefix or calls one of
// builders (functions of the same package that do).
func mentionsPrefix(n ast.Node, builders map[string]bool) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			if id, ok := x.Fun.(*ast.Ident); ok && builders[id.Name] {
				found = true
			}
		case *ast.BasicLit:
			if s, err := strconv.Unquote(x.Value); err == nil && strings.HasPrefix(s, "sg:") {
				found = true
			}
		case *ast.Ident:
			if x.Name == "prefix" {
				found = true
			}
		}
		return !found
	})
	return found
}

// keyRow is one row of store/README.md's key table.
type keyRow struct {
	pattern, pkg string
	re           *regexp.Regexp
}

// keyRows reads the key table: a pattern's {A} is any hash tag, and a
// colon-separated segment in capitals (I, W, YYYYMM) is any segment.
func keyRows(t *testing.T) []keyRow {
	t.Helper()
	b, err := os.ReadFile("store/README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(sg:[^`]*)` \\| [^|]* \\| [^|]* \\| `([a-z]+)` \\|")
	var out []keyRow
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var parts []string
		for _, seg := range strings.Split(m[1], ":") {
			switch {
			case seg == "{A}":
				parts = append(parts, `\{[^}]+\}`)
			case regexp.MustCompile(`^[A-Z][A-Z0-9]*$`).MatchString(seg):
				parts = append(parts, `[^:]+`)
			default:
				parts = append(parts, regexp.QuoteMeta(seg))
			}
		}
		out = append(out, keyRow{pattern: m[1], pkg: m[2], re: regexp.MustCompile("^" + strings.Join(parts, ":") + "$")})
	}
	if len(out) < 40 {
		t.Fatalf("store/README.md: %d key rows found; the table's shape changed", len(out))
	}
	return out
}

// TestRedisKeysListed: every key builder lives in its package's keys.go,
// gives an example, and its example matches exactly one row of
// store/README.md whose Package is the builder's; every row is matched by
// some builder (no key listed that nothing builds).
func TestRedisKeysListed(t *testing.T) {
	rows := keyRows(t)
	used := make([]bool, len(rows))
	builders := keyBuilders(t)
	if len(builders) < 40 {
		t.Fatalf("found %d key builders; the scan is broken", len(builders))
	}
	for _, b := range builders {
		where := b.pkg + "/" + b.file + ": " + b.name
		if b.file != "keys.go" {
			t.Errorf("%s builds a Redis key outside its package's keys.go", where)
		}
		if b.example == "" {
			t.Errorf("%s has no \"Example: sg:…\" in its doc comment", where)
			continue
		}
		var match []int
		for i, r := range rows {
			if r.re.MatchString(b.example) {
				match = append(match, i)
			}
		}
		switch {
		case len(match) == 0:
			t.Errorf("%s builds %s, which no row of store/README.md lists", where, b.example)
		case len(match) > 1:
			t.Errorf("%s: %s matches %d rows of store/README.md; want one", where, b.example, len(match))
		case rows[match[0]].pkg != filepath.Base(b.pkg):
			t.Errorf("%s builds %s, listed as owned by %s in store/README.md; want %s", where, b.example, rows[match[0]].pkg, filepath.Base(b.pkg))
		default:
			used[match[0]] = true
		}
	}
	for i, r := range rows {
		if !used[i] {
			t.Errorf("store/README.md lists %s (%s), which no key builder builds", r.pattern, r.pkg)
		}
	}
}
