package modal_test

import (
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal"
	"github.com/sandgate/sandgate/providers/modal/modaltest"
	"github.com/sandgate/sandgate/providers/providertest"
)

const (
	tokenID     = "ak-test-id"
	tokenSecret = "as-test-secret-planted"
)

// startFake starts a fake Modal server for the test.
func startFake(t testing.TB, cfg modaltest.Config) *modaltest.Server {
	t.Helper()
	cfg.TokenID, cfg.TokenSecret = tokenID, tokenSecret
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := modaltest.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("modaltest.Start: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// newProvider returns a provider talking to fake.
func newProvider(t testing.TB, fake *modaltest.Server, brokerID string) *modal.Provider {
	t.Helper()
	p, err := modal.New(t.Context(), modal.Config{
		ServerURL: fake.URL, TokenID: tokenID, TokenSecret: sandgate.Secret(tokenSecret), RootCAs: fake.CertPool,
		DefaultImage: "debian:bookworm-slim",
	}, providers.Env{BrokerID: brokerID})
	if err != nil {
		t.Fatalf("modal.New: %v", err)
	}
	return p
}

func TestProvider(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	providertest.Run(t, func(t *testing.T) providers.Provider { return newProvider(t, fake, "sandgate-test") })
}
