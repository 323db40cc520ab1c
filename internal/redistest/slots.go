package redistest

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CheckSlots makes rdb fail the test on any command that would touch more
// than one Redis Cluster hash slot: a script (EVAL, EVALSHA, FCALL) whose
// KEYS span slots, a multi-key command (DEL, MGET, RENAME, …) across
// slots, or a MULTI/EXEC transaction whose keys span slots (go-redis'
// cluster client splits such a transaction per slot, silently losing its
// atomicity). Pipelines without MULTI may span slots. Every client of
// Start and StartCluster has it, so every test of every package checks
// the scripts and transactions it runs, on one redis-server as on a
// cluster.
func CheckSlots(tb testing.TB, rdb redis.UniversalClient) {
	rdb.AddHook(slotHook{tb: tb})
}

type slotHook struct{ tb testing.TB }

func (slotHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slotHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmdKeys(cmd), cmd)
		return next(ctx, cmd)
	}
}

func (h slotHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		tx := len(cmds) > 0 && cmds[0].Name() == "multi"
		var all []string
		for _, c := range cmds {
			k := cmdKeys(c)
			h.check(k, c)
			if k == nil && tx && c.Name() != "multi" && c.Name() != "exec" && len(c.Args()) > 1 {
				k = []string{fmt.Sprint(c.Args()[1])} // a single-key command's key
			}
			all = append(all, k...)
		}
		if tx && len(all) > 1 && !OneSlot(all) {
			h.tb.Errorf("redistest: a MULTI/EXEC transaction touches keys of more than one hash slot (%s): on Redis Cluster it is not atomic", strings.Join(all, " "))
		}
		return next(ctx, cmds)
	}
}

func (h slotHook) check(keys []string, cmd redis.Cmder) {
	if len(keys) > 1 && !OneSlot(keys) {
		h.tb.Errorf("redistest: %s touches keys of more than one hash slot (%s): Redis Cluster refuses it", strings.ToUpper(cmd.Name()), strings.Join(keys, " "))
	}
}

// cmdKeys returns the keys of the commands whose keys can span slots.
func cmdKeys(cmd redis.Cmder) []string {
	args := cmd.Args()
	str := func(from, to, step int) []string {
		var out []string
		for i := from; i < to && i < len(args); i += step {
			out = append(out, fmt.Sprint(args[i]))
		}
		return out
	}
	switch cmd.Name() {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 3 {
			return nil
		}
		n, err := strconv.Atoi(fmt.Sprint(args[2]))
		if err != nil {
			return nil
		}
		return str(3, 3+n, 1)
	case "del", "unlink", "exists", "mget", "touch", "watch", "sinter", "sunion", "sdiff", "pfcount":
		return str(1, len(args), 1)
	case "mset", "msetnx":
		return str(1, len(args), 2)
	case "rename", "renamenx", "smove", "copy", "lmove", "rpoplpush", "zrangestore", "sinterstore", "sunionstore", "sdiffstore":
		return str(1, 3, 1)
	}
	return nil
}

// OneSlot reports whether every key hashes to the same cluster slot.
func OneSlot(keys []string) bool {
	for _, k := range keys[1:] {
		if Slot(k) != Slot(keys[0]) {
			return false
		}
	}
	return true
}

// Script is one Lua script of a package and a sample of the KEYS its
// call sites pass, built with the package's own key builders.
type Script struct {
	// Var is the package-level variable that holds the script (the
	// name ScriptVars finds), or a name of a script built at run time.
	Var string
	// Keys are the KEYS of each call site (one list per call site), built
	// from sample ids with the same key builders the call site uses.
	Keys [][]string
}

// CheckScripts fails the test unless scripts names every package-level
// variable of the package in dir that is set to redis.NewScript(…) (and
// no other, but for rows of scripts built at run time, whose Var holds a
// space), and each call site's KEYS of each script hash to one cluster
// slot. A
// package's slots_test.go holds its table; a new script without a row, or
// a row whose keys span slots, fails here.
func CheckScripts(t *testing.T, dir string, scripts []Script) {
	t.Helper()
	vars := ScriptVars(t, dir)
	var named []string
	for _, s := range scripts {
		named = append(named, s.Var)
		if len(s.Keys) == 0 {
			t.Errorf("script %s: no call site's keys listed", s.Var)
		}
		for _, keys := range s.Keys {
			if len(keys) == 0 {
				continue
			}
			if !OneSlot(keys) {
				var slots []string
				for _, k := range keys {
					slots = append(slots, fmt.Sprintf("%s→%d", k, Slot(k)))
				}
				t.Errorf("script %s touches more than one hash slot: %s", s.Var, strings.Join(slots, " "))
			}
		}
	}
	for _, n := range named {
		// A row of a script built at run time names it with a space
		// ("Pipeline (New)"); any other row must be a variable here.
		if !strings.Contains(n, " ") && !slices.Contains(vars, n) {
			t.Errorf("slot table row %s names no redis.NewScript variable in %s: remove or rename it", n, dir)
		}
	}
	for _, v := range vars {
		if !slices.Contains(named, v) {
			t.Errorf("script %s (redis.NewScript in %s) is not in the slot table: add its call sites' keys to slots_test.go", v, dir)
		}
	}
}

// ScriptVars returns the package-level variables of the non-test Go files
// in dir that are set to redis.NewScript(…).
func ScriptVars(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if isNewScript(v) && i < len(vs.Names) {
						out = append(out, vs.Names[i].Name)
					}
				}
			}
		}
	}
	return out
}

func isNewScript(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "NewScript" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "redis"
}
