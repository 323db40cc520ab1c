package redistest_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/redistest"
)

// recorder is a testing.TB that records Errorf instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckSlots: scripts, multi-key commands and transactions across
// slots are reported; the same within one hash tag, and plain pipelines
// across slots, are not.
func TestCheckSlots(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr})
	defer rdb.Close()
	rec := &recorder{TB: t}
	redistest.CheckSlots(rec, rdb)
	ctx := context.Background()
	run := func(name string, fn func(), want bool) {
		t.Helper()
		rec.errs = nil
		fn()
		if got := len(rec.errs) > 0; got != want {
			t.Errorf("%s: reported %v (%s); want reported %v", name, got, strings.Join(rec.errs, "; "), want)
		}
	}
	s := redis.NewScript(`return 1`)
	run("script in one tag", func() { s.Run(ctx, rdb, []string{"sg:{a}:x", "sg:{a}:y"}) }, false)
	run("script across tags", func() { s.Run(ctx, rdb, []string{"sg:{a}:x", "sg:{b}:y"}) }, true)
	run("del across slots", func() { rdb.Del(ctx, "sg:x", "sg:y") }, true)
	run("pipeline across slots", func() {
		p := rdb.Pipeline()
		p.Set(ctx, "sg:x", 1, 0)
		p.Set(ctx, "sg:y", 1, 0)
		p.Exec(ctx)
	}, false)
	run("transaction across slots", func() {
		p := rdb.TxPipeline()
		p.Set(ctx, "sg:x", 1, 0)
		p.Set(ctx, "sg:y", 1, 0)
		p.Exec(ctx)
	}, true)
	run("transaction in one tag", func() {
		p := rdb.TxPipeline()
		p.Set(ctx, "sg:{a}:x", 1, 0)
		p.SAdd(ctx, "sg:{a}:y", 1)
		p.Exec(ctx)
	}, false)
}

// TestEveryScriptPackageHasASlotTable: every package of the module that
// creates a Lua script (redis.NewScript) has a slots_test.go that checks
// its scripts with CheckScripts, so a script in a new package cannot
// escape the one-slot check.
func TestEveryScriptPackageHasASlotTable(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "redis.NewScript(") {
			dirs[filepath.Dir(p)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("found scripts in %d packages; want at least store, billing and admission", len(dirs))
	}
	for dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "slots_test.go"))
		if err != nil || !strings.Contains(string(b), "redistest.CheckScripts(") {
			t.Errorf("%s creates Lua scripts but has no slots_test.go calling redistest.CheckScripts", dir)
		}
	}
}
