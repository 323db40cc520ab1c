package broker

import (
	"strings"
	"testing"
	"time"
)

// TestStripeConfig: the billing.stripe block takes its overrides, and a
// bad value is refused naming its YAML path, never the key.
func TestStripeConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     map[string]string
		wantErr []string // nil: loads
		check   func(t *testing.T, c StripeConfig)
	}{
		{name: "absent: defaults left to stripesync", yaml: "log: {level: info}\n", check: func(t *testing.T, c StripeConfig) {
			if c != (StripeConfig{}) || c.keyEnv() != "SANDGATE_STRIPE_SECRET_KEY" {
				t.Errorf("billing.stripe = %+v, key env %s; want zero, SANDGATE_STRIPE_SECRET_KEY", c, c.keyEnv())
			}
		}},
		{name: "from YAML and env", yaml: "billing:\n  stripe: {base_url: 'http://127.0.0.1:12111', batch_size: 10, interval: 5s, secret_key_env: MY_STRIPE}\n",
			env: map[string]string{"SANDGATE_BILLING_STRIPE_INTERVAL": "2s", "SANDGATE_BILLING_STRIPE_DEAD_AFTER": "7"},
			check: func(t *testing.T, c StripeConfig) {
				if c.BaseURL != "http://127.0.0.1:12111" || c.BatchSize != 10 || c.Interval != 2*time.Second || c.DeadAfter != 7 || c.keyEnv() != "MY_STRIPE" {
					t.Errorf("billing.stripe = %+v; want the file's values with interval 2s and dead_after 7 from the environment", c)
				}
			}},
		{name: "bad base_url", yaml: "billing:\n  stripe: {base_url: 'ftp://x'}\n", wantErr: []string{"billing.stripe", "base_url"}},
		{name: "batch too big", yaml: "billing:\n  stripe: {batch_size: 20000}\n", wantErr: []string{"billing.stripe", "batch_size"}},
		{name: "timeout past the lease", yaml: "billing:\n  stripe: {request_timeout: 2m}\n", wantErr: []string{"billing.stripe", "request_timeout", "lease_ttl"}},
		{name: "a key where its variable goes", yaml: "billing:\n  stripe: {secret_key_env: sk_test_abc123}\n",
			wantErr: []string{"billing.stripe.secret_key_env", "not the key"}},
		{name: "bad env override", yaml: "log: {level: info}\n", env: map[string]string{"SANDGATE_BILLING_STRIPE_BATCH_SIZE": "many"},
			wantErr: []string{"SANDGATE_BILLING_STRIPE_BATCH_SIZE", "billing.stripe.batch_size"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadYAML(t, tt.yaml, tt.env)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("LoadConfig succeeded; want an error naming %v", tt.wantErr)
				}
				wantNaming(t, err, tt.wantErr)
				if strings.Contains(err.Error(), "sk_test_abc123") {
					t.Errorf("error %q holds the key", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			tt.check(t, cfg.Billing.Stripe)
		})
	}
}
