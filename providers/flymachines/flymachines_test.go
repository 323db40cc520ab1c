package flymachines_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flymachines/flytest"
	"github.com/sandgate/sandgate/providers/providertest"
)

const testToken = "fm2_flytest-token-7f3a"

// startFake starts a fake Machines API for the test.
func startFake(t testing.TB, o flytest.Options) *flytest.Server {
	t.Helper()
	o.Token = testToken
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	s, err := flytest.New(t.Context(), o)
	if err != nil {
		t.Fatalf("flytest.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// config is a provider config against s.
func config(t testing.TB, s *flytest.Server) flymachines.Config {
	return flymachines.Config{
		BaseURL: s.URL(), Token: sandgate.Secret(testToken), App: "sandgate-test", Org: "personal",
		BlobDir: t.TempDir(), Transport: s.Transport(),
	}
}

func newProvider(t testing.TB, s *flymachines.Config, broker string) *flymachines.Provider {
	t.Helper()
	p, err := flymachines.New(t.Context(), *s, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("flymachines.New: %v", err)
	}
	return p
}

func TestProviderSuite(t *testing.T) {
	s := startFake(t, flytest.Options{})
	cfg := config(t, s)
	providertest.Run(t, func(t *testing.T) providers.Provider { return newProvider(t, &cfg, "broker-suite") })
}

// waitUntil polls cond for at most d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var _ = context.Background
