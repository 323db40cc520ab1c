package local_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestKilledCreateFreesItsUID: a create that dies right after it claimed
// its uid (as under kill -9, before sandbox.json records the uid) does not
// keep that uid for good. With a range of one workspace uid, the next
// create succeeds only if the claim came back: after the reaper's
// Terminate of the half-made workspace, or, when its directory is gone
// already, after a restart.
func TestKilledCreateFreesItsUID(t *testing.T) {
	t.Parallel()
	size := sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 256}
	spec := func(ws string) providers.CreateSpec {
		return providers.CreateSpec{WorkspaceID: ws, InstanceID: "inst_x", Size: size, ExpiresAt: time.Now().Add(time.Hour)}
	}
	// open starts a provider over dir whose range holds one workspace uid;
	// with kill, its creates die right after the uid claim.
	open := func(t *testing.T, dir string, kill bool) *local.Provider {
		t.Helper()
		c := local.Config{DataDir: dir, UIDBase: 3 << 20, UIDCount: 2}
		if kill {
			local.SetAfterUIDClaim(&c, runtime.Goexit)
		}
		p, err := local.New(t.Context(), c, providers.Env{BrokerID: broker})
		if err != nil {
			t.Fatalf("local.New: %v", err)
		}
		t.Cleanup(func() { providertest.Discard(p) })
		return p
	}
	// killedCreate runs a create of ws on p that dies after its claim.
	killedCreate := func(t *testing.T, p *local.Provider, ws string) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Create(t.Context(), spec(ws))
			t.Errorf("Create(%s) returned; want it ended after its uid claim", ws)
		}()
		<-done
		claims, _ := os.ReadDir(filepath.Join(p.DataDir(), "uids"))
		if len(claims) != 1 {
			t.Fatalf("after the killed create: %d uid claims; want 1", len(claims))
		}
	}
	for _, tc := range []struct {
		name string
		// gone ends the half-made workspace ws after a restart (p is the
		// restarted provider); nil: its directory went before the restart.
		gone func(t *testing.T, p *local.Provider, ws string)
	}{
		{"reaper terminates it", func(t *testing.T, p *local.Provider, ws string) {
			sbs, err := p.List(t.Context())
			if err != nil || len(sbs) != 1 || sbs[0].Ref != ws {
				t.Fatalf("List after the killed create = %v, %v; want the half-made %s", sbs, err, ws)
			}
			if err := p.Terminate(t.Context(), sbs[0]); err != nil {
				t.Fatalf("Terminate(%s): %v", ws, err)
			}
		}},
		{"its directory is gone", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dataDir := t.TempDir()
			killedCreate(t, open(t, dataDir, true), "ws_killed")
			if tc.gone == nil {
				// A broker removed the directory and died before anything
				// freed the claim.
				if err := os.RemoveAll(filepath.Join(dataDir, "workspaces", "ws_killed")); err != nil {
					t.Fatal(err)
				}
			}
			p := open(t, dataDir, false) // the restart
			if tc.gone != nil {
				tc.gone(t, p, "ws_killed")
			}
			if _, err := p.Create(t.Context(), spec("ws_next")); err != nil {
				t.Fatalf("Create after the killed create was cleaned up: %v; want its uid free again", err)
			}
		})
	}
}
