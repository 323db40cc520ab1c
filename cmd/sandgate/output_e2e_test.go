package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// TestEveryCommandTakesOutputFlags: every command a user runs takes -o
// (--output) and -q (--quiet), its own or inherited. Cobra's generated
// help and completion commands are not ours, and print scripts or help.
func TestEveryCommandTakesOutputFlags(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		path := c.CommandPath()
		if !c.Runnable() || c.Name() == "help" || strings.HasPrefix(path, "sandgate completion") {
			return
		}
		n++
		for name, short := range map[string]string{"output": "o", "quiet": "q"} {
			if f := c.Flag(name); f == nil || f.Shorthand != short {
				t.Errorf("%s has no -%s/--%s", path, short, name)
			}
		}
	}
	root := rootCommand()
	root.InitDefaultCompletionCmd()
	walk(root)
	if n < 40 {
		t.Errorf("walked %d runnable commands; the tree has more", n)
	}
}

// TestOutputFlagsAndCompletion: a sample of every kind of command
// honours -q and -o json for real (creates print their id, lists their
// ids, reads and reports their JSON, local commands theirs), an unknown
// -o is a usage error, and completion offers the broker's accounts,
// instances and workspaces, and nothing, silently, when it cannot ask.
func TestOutputFlagsAndCompletion(t *testing.T) {
	_, cfg, s := startOne(t)
	env := s.AdminEnv()
	id := regexp.MustCompile(`^acct_[0-9A-Za-z]+\n$`)

	// A create: -q prints the id alone; -o json the object.
	acct := runCLI(t, env, "admin", "account", "create", "--name", "output-flags", "-q")
	if !id.MatchString(acct) {
		t.Fatalf("account create -q printed %q; want the id alone", acct)
	}
	acct = strings.TrimSpace(acct)
	var a adminapi.Account
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "account", "create", "--name", "output-flags-2", "-o", "json")), &a); err != nil || a.Name != "output-flags-2" {
		t.Fatalf("account create -o json: %+v, %v", a, err)
	}
	admin := s.Admin(t)
	inst := createInstance(t, admin, acct, 1)
	tok := issueToken(t, admin, inst)
	setFree(t, admin, acct)
	ws := acquire(t, s.Client(t, tok), "output-flags")

	// Lists: -q prints the ids, one a line; -o json the page.
	if got := runCLI(t, env, "admin", "account", "list", "-q"); !strings.Contains(got, acct+"\n") || strings.Contains(got, "NAME") {
		t.Errorf("account list -q printed %q; want ids only", got)
	}
	if got := runCLI(t, env, "workspace", "list", "-q"); got != ws.WorkspaceID+"\n" {
		t.Errorf("workspace list -q printed %q; want %q", got, ws.WorkspaceID+"\n")
	}
	var page adminapi.WorkspaceList
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "workspace", "list", "-o", "json")), &page); err != nil ||
		len(page.Workspaces) != 1 || page.Workspaces[0].ID != ws.WorkspaceID {
		t.Errorf("workspace list -o json: %+v, %v", page, err)
	}
	// A report with no ids: -q prints nothing and keeps the exit code.
	if got := runCLI(t, env, "usage", "reconcile", "-q"); got != "" {
		t.Errorf("usage reconcile -q printed %q; want nothing", got)
	}
	var reports []map[string]any
	if err := json.Unmarshal([]byte(runCLI(t, env, "usage", "reconcile", "-o", "json")), &reports); err != nil || len(reports) == 0 {
		t.Errorf("usage reconcile -o json: %v, %v", reports, err)
	}
	// Local commands.
	var bi map[string]any
	if err := json.Unmarshal([]byte(runCLI(t, nil, "version", "-o", "json")), &bi); err != nil || bi["version"] == nil {
		t.Errorf("version -o json: %v, %v", bi, err)
	}
	if got := runCLI(t, nil, "version", "-q"); got != "" {
		t.Errorf("version -q printed %q", got)
	}
	stdout, stderr, err := tryCLI(nil, "operator-token", "--name", "q", "--role", "admin", "-q")
	if err != nil || !strings.HasPrefix(stdout, operatorPrefix) || strings.Count(stdout, "\n") != 1 || stderr != "" {
		t.Errorf("operator-token -q: stdout %q, stderr %q, %v; want the token alone", stdout, stderr, err)
	}
	var check struct {
		OK bool `json:"ok"`
	}
	if err := json.Unmarshal([]byte(runCLI(t, cfg.env, "serve", "--check", "--config", cfg.Path, "-o", "json")), &check); err != nil || !check.OK {
		t.Errorf("serve --check -o json: %+v, %v", check, err)
	}
	if got := runCLI(t, cfg.env, "serve", "--check", "--config", cfg.Path, "-q"); got != "" {
		t.Errorf("serve --check -q printed %q", got)
	}
	if _, stderr, err := tryCLI(env, "admin", "account", "list", "-o", "yaml"); exitOf(t, err) != exitUsage {
		t.Errorf("-o yaml: exit %d (stderr %q); want %d", exitOf(t, err), stderr, exitUsage)
	}

	// Completion of values from the broker, each with its description.
	complete := func(env []string, args ...string) (values []string, stderr string) {
		t.Helper()
		stdout, stderr, err := tryCLI(env, append([]string{"__complete"}, args...)...)
		if err != nil {
			t.Fatalf("sandgate __complete %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
			if !strings.HasPrefix(l, ":") {
				values = append(values, l)
			}
		}
		return values, stderr
	}
	if got, _ := complete(env, "workspace", "list", "--account", ""); !slices.Contains(got, acct+"\toutput-flags") {
		t.Errorf("completion of --account: %q; want %q among them", got, acct+"\toutput-flags")
	}
	if got, _ := complete(env, "admin", "instance", "list", "--account", ""); !slices.Contains(got, a.ID+"\toutput-flags-2") {
		t.Errorf("completion of admin instance list --account: %q", got)
	}
	if got, _ := complete(env, "admin", "token", "list", "--instance", ""); !slices.Contains(got, inst+"\te2e "+acct) {
		t.Errorf("completion of --instance: %q; want %q among them", got, inst+"\te2e "+acct)
	}
	if got, _ := complete(env, "workspace", "exec", ""); len(got) != 1 || !strings.HasPrefix(got[0], ws.WorkspaceID+"\t"+acct) {
		t.Errorf("completion of workspace exec's ID: %q; want %s", got, ws.WorkspaceID)
	}
	if got, _ := complete(env, "admin", "workspace", "list", "--provider", ""); !slices.Contains(got, "local\tlocal") {
		t.Errorf("completion of --provider: %q", got)
	}
	down := []string{"SANDGATE_ADMIN_URL=http://127.0.0.1:1", "SANDGATE_ADMIN_TOKEN=x"}
	if got, stderr := complete(down, "workspace", "list", "--account", ""); len(got) != 0 || strings.Contains(stderr, "sandgate:") || strings.Contains(stderr, "refused") {
		t.Errorf("completion with the broker down: %q, stderr %q; want none, silently", got, stderr)
	}
}

// setFree marks acct free, so that its instance can acquire.
func setFree(t testing.TB, a *adminapi.Client, acct string) {
	t.Helper()
	if err := a.Do(t.Context(), "PUT", "/accounts/"+acct+"/billing", adminapi.BillingSettings{Free: true}, nil); err != nil {
		t.Fatal(err)
	}
}
