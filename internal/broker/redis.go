package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig is the `redis:` block: which Redis topology holds the
// broker's state and how to reach it.
type RedisConfig struct {
	// Mode is single (default: one Redis, or a proxy in front of one),
	// cluster (Redis Cluster: addrs are seed nodes) or sentinel (Redis
	// Sentinel: addrs are the sentinels, master_name the monitored set).
	Mode  string   `yaml:"mode"`
	Addr  string   `yaml:"addr"`  // single: host:port; default "127.0.0.1:6379"
	Addrs []string `yaml:"addrs"` // cluster: seed nodes; sentinel: sentinels (host:port each)
	// MasterName is the primary's name that the sentinels monitor (sentinel mode).
	MasterName string `yaml:"master_name"`
	Username   string `yaml:"username"` // ACL user; "" means the default user
	Password   string `yaml:"password"`
	// SentinelUsername and SentinelPassword authenticate to the
	// sentinels themselves, when they require it (sentinel mode).
	SentinelUsername string `yaml:"sentinel_username"`
	SentinelPassword string `yaml:"sentinel_password"`
	DB               int    `yaml:"db"` // single and sentinel only; a cluster has database 0 alone
	TLS              struct {
		Enabled    bool   `yaml:"enabled"`     // connect with TLS 1.2+
		CAFile     string `yaml:"ca_file"`     // PEM roots to verify the servers; "" means the system's
		ServerName string `yaml:"server_name"` // name to verify in the servers' certificates; "" means each address's host
	} `yaml:"tls"`
	// Wait is the durability of the writes that admit work or move money
	// (docs/scaling.md): after each, the broker waits until this many
	// replicas acknowledged it, and fails closed (503
	// admission_unavailable) when they do not within the timeout.
	Wait struct {
		Replicas int           `yaml:"replicas"` // default 0: no wait (a Redis without replicas)
		Timeout  time.Duration `yaml:"timeout"`  // default 500ms
	} `yaml:"wait"`
}

// Redis modes.
const (
	redisSingle   = "single"
	redisCluster  = "cluster"
	redisSentinel = "sentinel"
)

// check validates the block and fills its defaults.
func (r *RedisConfig) check() error {
	if r.Mode == "" {
		r.Mode = redisSingle
	}
	switch r.Mode {
	case redisSingle:
		if len(r.Addrs) > 0 {
			return errors.New("config: redis.addrs is for cluster and sentinel modes; in single mode set redis.addr")
		}
		if r.Addr == "" {
			r.Addr = "127.0.0.1:6379"
		}
	case redisCluster, redisSentinel:
		if r.Addr != "" {
			return fmt.Errorf("config: redis.addr is for single mode; in %s mode list the nodes in redis.addrs", r.Mode)
		}
		if len(r.Addrs) == 0 {
			return fmt.Errorf("config: redis.mode %s needs redis.addrs (host:port of the %s)", r.Mode, map[string]string{redisCluster: "cluster's seed nodes", redisSentinel: "sentinels"}[r.Mode])
		}
	default:
		return fmt.Errorf("config: redis.mode %q: want single, cluster or sentinel", r.Mode)
	}
	if r.Mode == redisSentinel && r.MasterName == "" {
		return errors.New("config: redis.mode sentinel needs redis.master_name, the name the sentinels monitor")
	}
	if r.Mode != redisSentinel && (r.MasterName != "" || r.SentinelUsername != "" || r.SentinelPassword != "") {
		return errors.New("config: redis.master_name, sentinel_username and sentinel_password are for sentinel mode")
	}
	if r.Mode == redisCluster && r.DB != 0 {
		return errors.New("config: redis.db must be 0 in cluster mode (Redis Cluster has database 0 only)")
	}
	if !r.TLS.Enabled && (r.TLS.CAFile != "" || r.TLS.ServerName != "") {
		return errors.New("config: redis.tls.ca_file and server_name need redis.tls.enabled: true")
	}
	if r.Wait.Replicas < 0 || r.Wait.Timeout < 0 {
		return errors.New("config: redis.wait.replicas and timeout must not be negative")
	}
	if r.Wait.Timeout == 0 {
		r.Wait.Timeout = 500 * time.Millisecond
	}
	return nil
}

// clusterReload is how often a cluster client reloads the slot map
// (CLUSTER SLOTS to one node), so that a gateway finds a promoted replica
// within a second of the failover rather than go-redis' default minute.
const clusterReload = time.Second

// NewRedis returns the client of the configured Redis topology. The
// admission timeout bounds every call, so a Redis outage fails closed
// quickly instead of hanging requests.
func NewRedis(cfg *Config) (redis.UniversalClient, error) {
	r := cfg.Redis
	var tc *tls.Config
	if r.TLS.Enabled {
		tc = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.TLS.ServerName}
		if r.TLS.CAFile != "" {
			pem, err := os.ReadFile(r.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("redis.tls.ca_file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, errors.New("redis.tls.ca_file: no PEM certificate in the file")
			}
		}
	}
	o := &redis.UniversalOptions{
		Addrs: r.Addrs, Username: r.Username, Password: r.Password, DB: r.DB,
		MasterName: r.MasterName, SentinelUsername: r.SentinelUsername, SentinelPassword: r.SentinelPassword,
		TLSConfig:   tc,
		DialTimeout: cfg.Admission.Timeout, ReadTimeout: cfg.Admission.Timeout, WriteTimeout: cfg.Admission.Timeout,
		PoolTimeout: cfg.Admission.Timeout, MaxRetries: 1,
	}
	switch r.Mode {
	case redisCluster:
		co := o.Cluster()
		co.ClusterStateReloadInterval = clusterReload
		return redis.NewClusterClient(co), nil
	case redisSentinel:
		return redis.NewFailoverClient(o.Failover()), nil
	}
	o.Addrs = []string{r.Addr}
	return redis.NewClient(o.Simple()), nil
}
