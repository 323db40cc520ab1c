package broker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/redistest"
)

// TestRedisConfig: each mode opens the client of its topology, and a
// config that cannot work says which field to fix.
func TestRedisConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     map[string]string
		want    string   // the client's type: single, cluster or sentinel; "" when loading must fail
		wantErr []string // words the error must hold
	}{
		{name: "default single", yaml: "log: {level: info}\n", want: "single"},
		{name: "cluster", yaml: "redis: {mode: cluster, addrs: [10.0.0.1:6379, 10.0.0.2:6379]}\n", want: "cluster"},
		{name: "cluster from the environment", yaml: "log: {level: info}\n", env: map[string]string{"SANDGATE_REDIS_MODE": "cluster", "SANDGATE_REDIS_ADDRS": "[10.0.0.1:6379]"}, want: "cluster"},
		{name: "sentinel", yaml: "redis: {mode: sentinel, addrs: [10.0.0.1:26379], master_name: sg, sentinel_password: p}\n", want: "sentinel"},
		{name: "tls", yaml: "redis: {mode: cluster, addrs: [a:1], username: sg, password: p, tls: {enabled: true, server_name: redis.internal}}\n", want: "cluster"},
		{name: "unknown mode", yaml: "redis: {mode: ring}\n", wantErr: []string{"redis.mode", `"ring"`}},
		{name: "cluster without addrs", yaml: "redis: {mode: cluster}\n", wantErr: []string{"redis.addrs"}},
		{name: "cluster with addr", yaml: "redis: {mode: cluster, addr: a:1, addrs: [b:1]}\n", wantErr: []string{"redis.addr ", "redis.addrs"}},
		{name: "cluster with a db", yaml: "redis: {mode: cluster, addrs: [a:1], db: 3}\n", wantErr: []string{"redis.db"}},
		{name: "sentinel without master", yaml: "redis: {mode: sentinel, addrs: [a:1]}\n", wantErr: []string{"redis.master_name"}},
		{name: "single with addrs", yaml: "redis: {addrs: [a:1]}\n", wantErr: []string{"redis.addrs", "redis.addr"}},
		{name: "ca file without tls", yaml: "redis: {tls: {ca_file: /x}}\n", wantErr: []string{"redis.tls.enabled"}},
		{name: "negative wait", yaml: "redis: {wait: {replicas: -1}}\n", wantErr: []string{"redis.wait"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := loadCase(t, tt.yaml, tt.env, tt.want == "", tt.wantErr)
			if cfg == nil {
				return
			}
			rdb, err := NewRedis(cfg)
			if err != nil {
				t.Fatalf("newRedis: %v", err)
			}
			defer rdb.Close()
			got := map[bool]string{true: "cluster"}[isCluster(rdb)]
			if got == "" {
				got = "single"
				if cfg.Redis.Mode == redisSentinel {
					got = "sentinel" // a failover client is a *redis.Client too
				}
			}
			if got != tt.want {
				t.Errorf("client for %q is %s; want %s", tt.yaml, got, tt.want)
			}
		})
	}
}

func isCluster(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.ClusterClient)
	return ok
}

// TestRedisTLSCAFile: a CA file that holds no certificate stops the
// broker with the field's name.
func TestRedisTLSCAFile(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig("", func(k string) string {
		return map[string]string{"SANDGATE_REDIS_TLS_ENABLED": "true", "SANDGATE_REDIS_TLS_CA_FILE": ca}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewRedis(cfg); err == nil || !strings.Contains(err.Error(), "redis.tls.ca_file") {
		t.Fatalf("newRedis with a bad CA file: %v; want an error naming redis.tls.ca_file", err)
	}
}

// TestRedisClusterClient: the cluster client built from config reaches a
// real cluster and runs a command on every primary's slots.
func TestRedisClusterClient(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	cfg, err := LoadConfig("", func(k string) string {
		return map[string]string{"SANDGATE_REDIS_MODE": "cluster", "SANDGATE_REDIS_ADDRS": "[" + c.Addrs[0] + "]"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := NewRedis(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	for _, k := range []string{"sg:{acct_a}:x", "sg:{acct_b}:x", "sg:{acct_c}:x", "sg:stop"} {
		if err := rdb.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
}
