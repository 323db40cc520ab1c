package broker

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleEnv is a valid, non-zero override value for a field of type t,
// built from the type so that a new field of any shape gets one.
func sampleEnv(t reflect.Type) string {
	switch {
	case t == durationType:
		return "7s"
	case t == nodeType:
		return "{k: v}"
	}
	switch t.Kind() {
	case reflect.String:
		return "x"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "7"
	case reflect.Float32, reflect.Float64:
		return "1.5"
	case reflect.Bool:
		return "true"
	case reflect.Map:
		return "{k: " + sampleEnv(t.Elem()) + "}"
	case reflect.Slice:
		return "[" + sampleEnv(t.Elem()) + "]"
	case reflect.Struct:
		return "{}"
	case reflect.Pointer:
		return sampleEnv(t.Elem())
	}
	return ""
}

// TestEnvOverridesEveryField sets each field's override alone and checks
// that it sets that field, for every field YAML can set.
func TestEnvOverridesEveryField(t *testing.T) {
	fields := envFields()
	if len(fields) < 40 {
		t.Fatalf("envFields() has %d fields; want every config field", len(fields))
	}
	// Variables sandgate reads for other things must never name a field.
	reserved := []string{"SANDGATE_ADMIN_URL", "SANDGATE_ADMIN_TOKEN", "SANDGATE_TEST_PAUSE_AFTER_CREATE", "SANDGATE_FLY_APP",
		"SANDGATE_FLY_ORG", "SANDGATE_FLY_REGION", "SANDGATE_E2E_ADMIN_TOKEN",
		"SANDGATE_STRIPE_SECRET_KEY"}
	seen := map[string]string{}
	for _, f := range fields {
		if slices.Contains(reserved, f.Env) {
			t.Errorf("%s overrides %s but is read for something else", f.Env, f.Path)
		}
		if other, dup := seen[f.Env]; dup {
			t.Errorf("%s overrides both %s and %s", f.Env, other, f.Path)
		}
		seen[f.Env] = f.Path
		t.Run(f.Path, func(t *testing.T) {
			v := sampleEnv(f.typ)
			if v == "" {
				t.Fatalf("no sample value for %s of type %s", f.Path, f.typ)
			}
			var c Config
			if err := applyEnv(&c, func(k string) string {
				if k == f.Env {
					return v
				}
				return ""
			}); err != nil {
				t.Fatalf("applyEnv(%s=%q): %v", f.Env, v, err)
			}
			if reflect.ValueOf(c).FieldByIndex(f.index).IsZero() {
				t.Errorf("applyEnv(%s=%q) left %s unset", f.Env, v, f.Path)
			}
		})
	}
}

// TestEnvOverrideNames keeps the names the README has always documented,
// and the old SANDGATE_PROVIDER.
func TestEnvOverrideNames(t *testing.T) {
	env := map[string]string{
		"SANDGATE_LISTEN": "127.0.0.1:1", "SANDGATE_ADMIN_LISTEN": "127.0.0.1:2", "SANDGATE_DATA_DIR": "/d",
		"SANDGATE_BROKER_ID": "b", "SANDGATE_TLS_CERT_FILE": "/c", "SANDGATE_TLS_KEY_FILE": "/k",
		"SANDGATE_REDIS_ADDR": "r:1", "SANDGATE_REDIS_PASSWORD": "pw: [not yaml", "SANDGATE_REDIS_DB": "3",
		"SANDGATE_PROVIDER": "local", "SANDGATE_LOG_LEVEL": "debug", "SANDGATE_LOG_FORMAT": "text",
		"SANDGATE_ADMISSION_TIMEOUT": "5s", "SANDGATE_ADMISSION_RISK_MAX_SIZE": "large",
		"SANDGATE_TLS_TRUSTED_PROXIES": "[10.0.0.0/8, 127.0.0.1]", "SANDGATE_DRAIN_DELAY": "3s",
	}
	c, err := LoadConfig("", func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	got := []any{c.Listen, c.AdminListen, c.DataDir, c.BrokerID, c.TLS.CertFile, c.TLS.KeyFile, c.Redis.Addr, c.Redis.Password,
		c.Redis.DB, c.Provider.Name, c.Log.Level, c.Log.Format, c.Admission.Timeout, c.Admission.Risk.MaxSize,
		strings.Join(c.TLS.TrustedProxies, ","), c.DrainDelay}
	want := []any{"127.0.0.1:1", "127.0.0.1:2", "/d", "b", "/c", "/k", "r:1", "pw: [not yaml", 3, "local", "debug", "text",
		5 * time.Second, "large", "10.0.0.0/8,127.0.0.1", 3 * time.Second}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("loadConfig with overrides = %v; want %v", got, want)
	}
}

// TestEnvOverrideErrorHidesValue: a bad value is named by its variable,
// never echoed (it may be a secret).
func TestEnvOverrideErrorHidesValue(t *testing.T) {
	const secret = "SECRET-VALUE-123"
	_, err := LoadConfig("", func(k string) string {
		if k == "SANDGATE_REDIS_DB" {
			return secret
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "SANDGATE_REDIS_DB") || strings.Contains(err.Error(), secret) {
		t.Errorf("LoadConfig(SANDGATE_REDIS_DB=%q) error = %v; want one naming the variable, not the value", secret, err)
	}
}

// TestREADMEListsEveryOverride keeps the README's override table from
// drifting: every generated name is in it.
func TestREADMEListsEveryOverride(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range envFields() {
		if !strings.Contains(string(b), "`"+f.Env+"`") {
			t.Errorf("README.md does not list `%s` (%s)", f.Env, f.Path)
		}
	}
}
