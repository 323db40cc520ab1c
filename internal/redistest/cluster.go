package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a running Redis Cluster on loopback: three primaries, each
// with one replica, every node a redis-server of its own (AOF on, a low
// cluster-node-timeout so that a killed primary's replica takes over
// within seconds, and no wait before a replica's full sync: by default
// Redis waits 5 s for more replicas to share it, at every start and
// every failover).
type Cluster struct {
	dir   string
	nodes []*clusterNode
	// Addrs are the nodes' host:port, the seeds a client is given.
	Addrs []string
}

type clusterNode struct {
	port, bus int
	dir       string
	cmd       *exec.Cmd
	exited    chan struct{} // closed when cmd has exited and been waited for
}

// errNodeExited is a node's redis-server that ended while the cluster
// started: most often its port was taken (by another test's server or a
// client's ephemeral port) between freePorts and its bind. NewCluster and
// Start then try other ports.
var errNodeExited = errors.New("redis-server exited")

// errCreate is redis-cli --cluster create failing on nodes that all
// answered: seen when a node died or lost its bus port between the ping
// and the create (two suites starting clusters on one host at once).
// NewCluster tries other ports then too.
var errCreate = errors.New("redis-cli --cluster create failed")

// startSem bounds how many clusters StartCluster starts at once in one
// test process: a
// package whose tests each start one would otherwise start dozens of
// redis-servers at the same instant on a small machine.
var startSem = make(chan struct{}, 2)

// NodeTimeout is the test cluster's cluster-node-timeout: a primary that
// does not answer for this long is failed over to its replica.
const NodeTimeout = time.Second

// StartCluster runs a Redis Cluster until the test ends. It fails the
// test, never skips it, when redis-server or redis-cli is missing.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	startSem <- struct{}{}
	defer func() { <-startSem }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := NewCluster(ctx, tb.TempDir())
	if err != nil {
		tb.Fatalf("start redis cluster: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// NewCluster starts a Redis Cluster whose files live under dir, for
// tools that are not tests (cmd/sandgate-load). The caller must Close it.
func NewCluster(ctx context.Context, dir string) (*Cluster, error) {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s is not installed (package redis-server, which brings redis-tools; make test installs it): %w", bin, err)
		}
	}
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, filepath.Join(dir, "try"+strconv.Itoa(attempt)))
		if (errors.Is(err, errNodeExited) || errors.Is(err, errCreate)) && attempt < 3 {
			continue
		}
		return c, err
	}
}

// startCluster is one attempt of NewCluster, on fresh ports.
func startCluster(ctx context.Context, dir string) (*Cluster, error) {
	c := &Cluster{dir: dir}
	ports, err := freePorts(12)
	if err != nil {
		return nil, err
	}
	for i := range 6 {
		n := &clusterNode{port: ports[2*i], bus: ports[2*i+1], dir: filepath.Join(dir, "node"+strconv.Itoa(i))}
		if err := os.MkdirAll(n.dir, 0o700); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.addr())
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := waitPing(ctx, n.addr(), n.cmd.Process.Pid, n.exited); err != nil {
			return nil, err
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: %w: %s", errCreate, err, plain(out))
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func (n *clusterNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

func (n *clusterNode) start() error {
	cmd, exited, err := runServer("--port", strconv.Itoa(n.port), "--cluster-port", strconv.Itoa(n.bus),
		"--dir", n.dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout/time.Millisecond)),
		"--repl-diskless-sync-delay", "0")
	if err != nil {
		return err
	}
	n.cmd, n.exited = cmd, exited
	return nil
}

// kill stops the node with SIGKILL, as a crash would.
func (n *clusterNode) kill() {
	killServer(n.cmd, n.exited)
	n.cmd = nil
}

// Close kills every node.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.kill()
	}
}

// Client returns a new cluster client over every node. The caller closes
// it. It reloads the slot map every second, as sandgate's does, so that it
// finds a promoted replica without a restart.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		ClusterStateReloadInterval: time.Second,
	})
}

// WaitHealthy waits until every running node reports cluster_state:ok,
// every slot is served, and every primary has a replica whose link is up.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return poll(ctx, "redis cluster not healthy", c.healthy)
}

// poll calls check every 50ms until it returns nil, or until ctx ends:
// then it returns check's last error after msg.
func poll(ctx context.Context, msg string, check func(context.Context) error) error {
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", msg, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) error {
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: n.addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := rdb.ClusterInfo(ctx).Result()
		var repl string
		if err == nil {
			repl, err = rdb.Info(ctx, "replication").Result()
		}
		rdb.Close()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: cluster not ok", n.addr())
		}
		switch {
		case strings.Contains(repl, "role:master"):
			if !strings.Contains(repl, "connected_slaves:1") {
				return fmt.Errorf("%s: primary without its replica", n.addr())
			}
		case !strings.Contains(repl, "master_link_status:up"):
			return fmt.Errorf("%s: replica link down", n.addr())
		}
	}
	return nil
}

// KillPrimaryOf kills (SIGKILL) the primary that serves key's slot and
// returns its address. Its replica takes over after NodeTimeout; use
// WaitFailover to wait for it.
func (c *Cluster) KillPrimaryOf(ctx context.Context, key string) (string, error) {
	slot := int64(Slot(key))
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		shards, err := shardsOf(ctx, n.addr())
		if err != nil {
			continue
		}
		for _, sh := range shards {
			primary := primaryOf(sh)
			for _, r := range sh.Slots {
				if slot < r.Start || slot > r.End {
					continue
				}
				for _, m := range c.nodes {
					if m.addr() == primary && m.cmd != nil {
						m.kill()
						return m.addr(), nil
					}
				}
			}
		}
	}
	return "", errors.New("redistest: no running primary serves the key's slot")
}

// Restart starts the killed node at addr again, on its port and data
// directory: it rejoins the cluster as a replica of the primary that took
// its slots. Use WaitHealthy to wait until it has synced.
func (c *Cluster) Restart(addr string) error {
	for _, n := range c.nodes {
		if n.addr() == addr {
			if n.cmd != nil {
				return fmt.Errorf("redistest: %s is running", addr)
			}
			return n.start()
		}
	}
	return fmt.Errorf("redistest: no node %s", addr)
}

// WaitFailover waits until every slot is served again by a running node
// (the killed primary's replica promoted). The killed node stays down.
func (c *Cluster) WaitFailover(ctx context.Context) error {
	return poll(ctx, "redis cluster did not fail over", c.served)
}

func (c *Cluster) served(ctx context.Context) error {
	running := map[string]bool{}
	for _, n := range c.nodes {
		running[n.addr()] = n.cmd != nil
	}
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: n.addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := rdb.ClusterInfo(ctx).Result()
		rdb.Close()
		var shards []redis.ClusterShard
		if err == nil {
			shards, err = shardsOf(ctx, n.addr())
		}
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster not ok", n.addr())
		}
		var covered int64
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if p := primaryOf(sh); !running[p] {
					return fmt.Errorf("%s: slots %d-%d still on a stopped primary %s", n.addr(), r.Start, r.End, p)
				}
				covered += r.End - r.Start + 1
			}
		}
		if covered != 16384 {
			return fmt.Errorf("%s: %d slots served", n.addr(), covered)
		}
	}
	return nil
}

// shardsOf returns CLUSTER SHARDS as the node at addr sees it.
func shardsOf(ctx context.Context, addr string) ([]redis.ClusterShard, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer rdb.Close()
	return rdb.ClusterShards(ctx).Result()
}

// primaryOf returns the host:port of a shard's primary, "" when it has none.
func primaryOf(sh redis.ClusterShard) string {
	for _, n := range sh.Nodes {
		if n.Role == "master" {
			return n.IP + ":" + strconv.FormatInt(n.Port, 10)
		}
	}
	return ""
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag (the part between the first { and the next }, when
// not empty), modulo 16384, as the cluster specification defines it.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum of
// the cluster specification's key hashing.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// waitPing waits until the redis-server with process id pid answers at
// addr. A server of another test that answers there means ours could not
// bind the port and will exit: only our own process's answer counts.
func waitPing(ctx context.Context, addr string, pid int, exited <-chan struct{}) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer rdb.Close()
	want := "process_id:" + strconv.Itoa(pid) + "\r\n"
	for {
		info, err := rdb.Info(ctx, "server").Result()
		if err == nil && strings.Contains(info, want) {
			return nil
		}
		if err == nil {
			err = errors.New("another redis-server answers there")
		}
		select {
		case <-exited:
			return fmt.Errorf("%w: %s", errNodeExited, addr)
		case <-ctx.Done():
			return fmt.Errorf("redis-server %s did not answer: %w", addr, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free loopback ports, all held open until
// every one is chosen so none is handed out twice.
func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer ln.Close()
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// plain is redis-cli's output without its colour codes, on one line.
func plain(b []byte) string {
	s := regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(string(b), "")
	return strings.Join(strings.Fields(s), " ")
}

// Topologies are the Redis topologies a store test runs against: one
// redis-server and a Redis Cluster.
var Topologies = []string{"single", "cluster"}

// Each runs fn as a parallel subtest per topology (named after it), each
// with a client of its own fresh Redis: one redis-server, or a Redis
// Cluster of six nodes.
func Each(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	for _, topo := range Topologies {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			fn(t, Open(t, topo))
		})
	}
}

// Open starts a fresh Redis of the topology ("single" or "cluster") and
// returns a client of it, closed when the test ends.
func Open(tb testing.TB, topology string) redis.UniversalClient {
	tb.Helper()
	switch topology {
	case "single":
		return Start(tb).Client()
	case "cluster":
		c := StartCluster(tb).Client()
		CheckSlots(tb, c)
		tb.Cleanup(func() { c.Close() })
		return c
	}
	tb.Fatalf("redistest: unknown topology %q", topology)
	return nil
}
