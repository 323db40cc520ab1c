package main

// The noisy-neighbour figure (issue 10): against one real `sandgate dev`,
// three small workspaces of one instance. C runs n sequential `exec true`
// while A and B are quiet (the baseline), then A keeps a fork tree at its
// process cap and B allocates past its memory limit in a loop (both
// durable commands with a timeout), and once the host's cgroup files show
// both at their limits C runs the same n execs again. It reports p50 and
// p90 of each phase and the ratios noisy ÷ quiet.
//
// Whether A and B are at their limits is read from the workspaces'
// cgroups on the host (this tool runs beside the broker, as root), not by
// an exec: each exec has its own pid namespace, so it cannot count the
// fork tree's processes, and an exec in A cannot even start while A is at
// its cap (the exec's step joins A's cgroups before it forks).

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// forkTree is A's durable command: four perl processes, each forking
// without pause a child that execs `sleep 30`; at the cap every fork fails
// (EAGAIN) and is retried at once, so A stays at its process cap, spinning
// on fork, with children exiting and being replaced every 30 s.
const forkTree = `$SIG{CHLD} = "IGNORE"; for (1 .. 3) { last if !fork } while (1) { my $p = fork; if (defined $p && $p == 0) { exec "sleep", "30"; exit 1 } }`

// memHog is B's durable command: rounds of four processes each building a
// 160 MiB string (about twice that at its peak, the temporary and the
// copy) and holding it for a second: 0.6 to 1.3 GiB asked of a 512 MiB
// workspace, so the OOM killer kills one or more in every round. Bounded
// by its round count and the command's timeout.
const memHog = `i=0; while [ $i -lt 100000 ]; do for j in 1 2 3 4; do perl -e '$x = "a" x (160 << 20); sleep 1' & done; wait; i=$((i+1)); done`

// minNoisyPhase is the noisy phase's least length: several of B's cycles
// (allocate up to its limit, be OOM-killed, start again).
const minNoisyPhase = 5 * time.Second

func runNoisy(ctx context.Context, bin string, n int, hold time.Duration) error {
	if n < 1 || hold < 2*time.Minute+15*time.Second {
		return errors.New("-n must be at least 1 and -hold at least 2m15s (90 s for the neighbours to reach their limits, 30 s to settle, the phase, 10 s to spare)")
	}
	dir, bin, err := workDir(ctx, "sandgate-load-", bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dev, err := startDev(ctx, bin, filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer dev.stop()
	if unenforced := logLines(dev.logs, "NOT ENFORCED"); len(unenforced) > 0 {
		fmt.Printf("WARNING: the broker enforces not every workspace limit:\n%s\n", strings.Join(unenforced, "\n"))
	}
	b, err := noisyInstance(ctx, dev)
	if err != nil {
		return err
	}

	// The three workspaces; each is released at the end, whatever happened.
	names := []string{"a-forktree", "b-memhog", "c-probe"}
	ws := make([]string, len(names))
	for i, name := range names {
		var w protocol.Workspace
		if err := b.call(ctx, http.MethodPost, "/v1/workspaces", protocol.AcquireRequest{Label: name, Size: "small",
			Egress: &protocol.Egress{AllowedDomains: []string{}}}, "noisy-"+name+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), &w); err != nil {
			return fmt.Errorf("acquire %s: %w", name, err)
		}
		ws[i] = w.WorkspaceID
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer cancel()
			if err := b.call(rctx, http.MethodDelete, "/v1/workspaces/"+w.WorkspaceID, nil, "", nil); err != nil {
				fmt.Fprintf(os.Stderr, "release %s: %v\n", name, err)
			}
		}()
	}
	a, bw, c := ws[0], ws[1], ws[2]
	cg := newCgroupFiles()

	// What each workspace gets: its CPUs (affinity), CPU quota, memory
	// and process limits, from the host's cgroup files.
	fmt.Printf("host: %d CPUs online, load average %s\n", cpusOnline(), loadavg())
	for i, w := range ws {
		res, _, err := b.run(ctx, w, []string{"sh", "-c", "grep Cpus_allowed_list /proc/self/status"})
		if err != nil {
			return fmt.Errorf("affinity of %s: %w", names[i], err)
		}
		cpus := strings.TrimSpace(strings.TrimPrefix(decode(res.StdoutB64), "Cpus_allowed_list:"))
		fmt.Printf("%s %s: CPUs %s, cpu quota %s, memory limit %s, pids.max %s\n", names[i], w, cpus,
			cg.cpuQuota(w), cg.text("memory", w, "memory.limit_in_bytes", "memory.max"), cg.text("pids", w, "pids.max", "pids.max"))
	}

	// Warm-up, then the quiet phase.
	for range 10 {
		if _, _, err := b.run(ctx, c, []string{"true"}); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	fmt.Printf("quiet phase: load average %s\n", loadavg())
	cpu0 := cpuTimes()
	quiet, err := b.latencies(ctx, c, n, time.Time{})
	if err != nil {
		return fmt.Errorf("quiet phase: %w", err)
	}
	fmt.Printf("quiet phase: host CPUs busy %s\n", busy(cpu0, cpuTimes()))

	// The neighbours. Cancelled at the end (Release would kill them too);
	// the timeout bounds them should this tool die.
	holdSec := int64(hold / time.Second)
	noiseStart := time.Now()
	for _, cmd := range []struct {
		ws, id string
		argv   []string
	}{{a, "forktree", []string{"perl", "-e", forkTree}}, {bw, "memhog", []string{"sh", "-c", memHog}}} {
		var st protocol.CommandStatus
		if err := b.call(ctx, http.MethodPut, "/v1/workspaces/"+cmd.ws+"/commands/"+cmd.id,
			protocol.ExecRequest{Argv: cmd.argv, TimeoutSeconds: holdSec}, "", &st); err != nil {
			return fmt.Errorf("start %s: %w", cmd.id, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer cancel()
			if err := b.call(cctx, http.MethodPost, "/v1/workspaces/"+cmd.ws+"/commands/"+cmd.id+"/cancel", nil, "", nil); err != nil {
				fmt.Fprintf(os.Stderr, "cancel %s: %v\n", cmd.id, err)
			}
		}()
	}
	pidsMax := cg.int("pids", a, "pids.max")
	memLimit := cg.int("memory", bw, "memory.limit_in_bytes", "memory.max")
	atCap := func() bool { return pidsMax > 0 && cg.int("pids", a, "pids.current") >= pidsMax*98/100 }
	ooms0 := cg.oomKills(bw)
	for !atCap() || cg.oomKills(bw) == ooms0 {
		if time.Since(noiseStart) > 90*time.Second || ctx.Err() != nil {
			return fmt.Errorf("the neighbours did not reach their limits within 90s: A has %d of %d processes, B %d OOM kills",
				cg.int("pids", a, "pids.current"), pidsMax, cg.oomKills(bw)-ooms0)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("neighbours at their limits after %s: A %d of %d processes (%d forks refused), B %d OOM kills, load average %s\n",
		time.Since(noiseStart).Round(100*time.Millisecond), cg.int("pids", a, "pids.current"), pidsMax,
		cg.forksRefused(a), cg.oomKills(bw)-ooms0, loadavg())

	// Steady state: the broker samples every workspace's CPU use once a
	// second and gives one busy for two ticks the background weight
	// (providers/local/cpuweight.go). The figure is of a neighbour that
	// keeps at it, so the phase starts once both have it; what the first
	// seconds of a burst cost, before that, is in docs/benchmarks.md.
	weight := func(ws string) int64 {
		if w := cg.int("cpu", ws, "cpu.shares"); w > 0 {
			return w
		}
		return cg.int("cpu", ws, "cpu.weight") * 1024 / 100
	}
	settle := time.Now()
	for weight(a) >= 1024 || weight(bw) >= 1024 {
		if time.Since(settle) > 30*time.Second || ctx.Err() != nil {
			fmt.Printf("the broker did not lower the neighbours' CPU weights within 30s (A %d, B %d): measuring as they are\n", weight(a), weight(bw))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("neighbours at the background CPU weight %s later: A %d, B %d (C %d)\n",
		time.Since(settle).Round(100*time.Millisecond), weight(a), weight(bw), weight(c))

	// The noisy phase, with a sampler that checks the neighbours stay at
	// their limits throughout. It ends before the commands' timeout.
	var mu sync.Mutex
	s := sample{minPids: pidsMax}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	forks0, ooms1 := cg.forksRefused(a), cg.oomKills(bw)
	throttled0 := make([]int64, len(ws))
	for i, w := range ws {
		throttled0[i] = cg.keyed("cpu", w, "cpu.stat", "nr_throttled")
	}
	cpu1 := cpuTimes()
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			p, m := cg.int("pids", a, "pids.current"), cg.int("memory", bw, "memory.usage_in_bytes", "memory.current")
			mu.Lock()
			s.n++
			s.minPids, s.maxMem = min(s.minPids, p), max(s.maxMem, m)
			if p >= pidsMax*98/100 {
				s.atCap++
			}
			mu.Unlock()
		}
	})
	// The phase lasts at least minNoisyPhase, n execs at a time, so that it
	// spans B's whole allocate-and-be-killed cycle however fast C's execs are.
	phaseStart := time.Now()
	var noisy []time.Duration
	var perr error
	deadline, want := noiseStart.Add(hold-10*time.Second), 0
	for perr == nil && (want == 0 || time.Since(phaseStart) < minNoisyPhase && time.Now().Before(deadline)) {
		var more []time.Duration
		want += n
		more, perr = b.latencies(ctx, c, n, deadline)
		noisy = append(noisy, more...)
	}
	phase := time.Since(phaseStart)
	close(stop)
	wg.Wait()
	load, cpuBusy := loadavg(), busy(cpu1, cpuTimes())
	var throttled, weights []string
	for i, w := range ws {
		throttled = append(throttled, fmt.Sprintf("%s %d", names[i], cg.keyed("cpu", w, "cpu.stat", "nr_throttled")-throttled0[i]))
		weight := cg.text("cpu", w, "cpu.shares")
		if weight == "(none)" {
			weight = cg.text("cpu", w, "cpu.weight")
		}
		weights = append(weights, names[i]+" "+weight)
	}
	if perr != nil {
		return fmt.Errorf("noisy phase: %w", perr)
	}
	s.forks, s.ooms = cg.forksRefused(a)-forks0, cg.oomKills(bw)-ooms1

	// Figures.
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	q50, q90, z50, z90 := pct(quiet, 50), pct(quiet, 90), pct(noisy, 50), pct(noisy, 90)
	fmt.Printf("\nnoisy phase: %d execs in %s; load average %s at its end; host CPUs busy %s\n",
		len(noisy), phase.Round(time.Millisecond), load, cpuBusy)
	fmt.Printf("CFS periods throttled by the CPU quota during it: %s\n", strings.Join(throttled, ", "))
	fmt.Printf("CPU weights at its end (the broker lowers a busy workspace's): %s\n", strings.Join(weights, ", "))
	fmt.Printf("during it (%d samples, every 100 ms): A at ≥98%% of its cap in %d, at least %d of %d processes, %d forks refused; "+
		"B peak memory %.0f of %.0f MiB, %d OOM kills\n\n", s.n, s.atCap, s.minPids, pidsMax, s.forks,
		float64(s.maxMem)/(1<<20), float64(memLimit)/(1<<20), s.ooms)
	fmt.Printf("| `exec true` in C (%d sequential quiet, %d noisy) | p50 | p90 | max |\n| --- | ---: | ---: | ---: |\n", len(quiet), len(noisy))
	fmt.Printf("| quiet (A, B idle) | %s | %s | %s |\n", ms(q50), ms(q90), ms(slices.Max(quiet)))
	fmt.Printf("| noisy (A at its process cap, B OOM-looping) | %s | %s | %s |\n", ms(z50), ms(z90), ms(slices.Max(noisy)))
	fmt.Printf("| noisy ÷ quiet | %.2f × | %.2f × | — |\n", float64(z50)/float64(q50), float64(z90)/float64(q90))
	if len(noisy) < want {
		return fmt.Errorf("the noisy phase measured only %d of %d execs before the neighbours' timeout (-hold)", len(noisy), want)
	}
	if s.atCap*10 < s.n*9 || s.ooms == 0 {
		return errors.New("the neighbours were not at their limits throughout the noisy phase (see above)")
	}
	if r := float64(z50) / float64(q50); r > 1.5 {
		return fmt.Errorf("noisy p50 is %.2f × the quiet p50, above 1.5 ×", r)
	}
	return nil
}

// sample is what the noisy phase's sampler saw.
type sample struct {
	n, atCap    int
	minPids     int64
	maxMem      int64
	forks, ooms int64
}

// noisyInstance creates, through the operator API, an instance of the dev
// account that admits three small workspaces, and returns a broker client
// with a token of it.
func noisyInstance(ctx context.Context, dev *broker) (*broker, error) {
	adm, err := adminapi.NewClient(dev.env["SANDGATE_ADMIN_URL"], sandgate.Secret(dev.env["SANDGATE_ADMIN_TOKEN"]), nil)
	if err != nil {
		return nil, err
	}
	var accounts []adminapi.Account
	if err := adm.Do(ctx, http.MethodGet, "/accounts", nil, &accounts); err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	i := slices.IndexFunc(accounts, func(a adminapi.Account) bool { return a.Name == "dev" })
	if i < 0 {
		return nil, errors.New("sandgate dev bootstrapped no account named dev")
	}
	var in adminapi.Instance
	if err := adm.Do(ctx, http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: accounts[i].ID, Name: "noisy",
		Scope: adminapi.Scope{Sizes: []string{"small"}, DefaultSize: "small",
			Limits: protocol.Limits{MaxConcurrentWorkspaces: 3}}}, &in); err != nil {
		return nil, fmt.Errorf("create instance: %w", err)
	}
	var tok adminapi.IssuedToken
	if err := adm.Do(ctx, http.MethodPost, "/instances/"+in.ID+"/tokens", adminapi.IssueTokenRequest{}, &tok); err != nil {
		return nil, fmt.Errorf("issue token: %w", err)
	}
	if tok.Token == "" {
		return nil, errors.New("issue token: no token in the answer")
	}
	nb := &broker{url: dev.url, token: tok.Token, hc: dev.hc}
	var lease protocol.LeaseResponse
	if err := nb.call(ctx, http.MethodGet, "/v1/lease", nil, "", &lease); err != nil {
		return nil, fmt.Errorf("lease of the noisy instance: %w", err)
	}
	if lease.Limits.MaxConcurrentWorkspaces < 3 {
		return nil, fmt.Errorf("the noisy instance admits %d workspaces, not 3", lease.Limits.MaxConcurrentWorkspaces)
	}
	return nb, nil
}

// run runs argv once, retrying refusals (429, 503) after their
// Retry-After, and returns the answer and the time of the admitted
// request alone. A non-zero exit is an error.
func (b *broker) run(ctx context.Context, ws string, argv []string) (protocol.ExecResponse, time.Duration, error) {
	var res protocol.ExecResponse
	for range 20 {
		start := time.Now()
		resp, err := b.do(ctx, http.MethodPost, "/v1/workspaces/"+ws+"/exec", protocol.ExecRequest{Argv: argv}, "")
		if err != nil {
			return res, 0, err
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			readClose(resp.Body)
			wait, _ := strconv.Atoi(resp.Header.Get(protocol.HeaderRetryAfter))
			select {
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			case <-ctx.Done():
				return res, 0, ctx.Err()
			}
			continue
		}
		err = decodeJSON(resp, &res)
		took := time.Since(start)
		if err != nil {
			return res, took, err
		}
		if res.ExitCode != 0 {
			return res, took, fmt.Errorf("%v: exit %d, stderr %q", argv, res.ExitCode, decode(res.StderrB64))
		}
		return res, took, nil
	}
	return res, 0, fmt.Errorf("%v: refused 20 times", argv)
}

// latencies runs `true` n times in a row in ws and returns each one's
// time; it stops early (fewer than n) at deadline, when set.
func (b *broker) latencies(ctx context.Context, ws string, n int, deadline time.Time) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		if !deadline.IsZero() && time.Now().After(deadline) {
			break
		}
		_, took, err := b.run(ctx, ws, []string{"true"})
		if err != nil {
			return out, err
		}
		out = append(out, took)
	}
	if len(out) == 0 {
		return nil, errors.New("no exec measured")
	}
	return out, nil
}

// pct is the p-th percentile of ds, nearest rank.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max((len(s)*p+99)/100-1, 0)]
}

// cgroupFiles reads workspace cgroup files on the host. It finds each
// workspace's directory once: a glob over every sandgate parent on each
// read would list them all ten times a second, and the kernfs lookups it
// costs would compete with the very cgroup work of the execs measured.
type cgroupFiles struct {
	mu   sync.Mutex
	dirs map[string]string // controller + "/" + workspace → its directory
}

func newCgroupFiles() *cgroupFiles { return &cgroupFiles{dirs: make(map[string]string)} }

// path is one workspace cgroup file: in v1's hierarchy of the controller,
// else v2's unified one, below any sandgate parent; "" when there is none.
func (cg *cgroupFiles) path(ctl, ws, file string) string {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	dir, ok := cg.dirs[ctl+"/"+ws]
	if !ok {
		for _, pat := range []string{"/sys/fs/cgroup/" + ctl + "/sandgate/*/" + ws, "/sys/fs/cgroup/sandgate/*/" + ws} {
			if m, _ := filepath.Glob(pat); len(m) == 1 {
				dir = m[0]
				break
			}
		}
		if dir == "" {
			return ""
		}
		cg.dirs[ctl+"/"+ws] = dir
	}
	p := filepath.Join(dir, file)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// text is the content of the first of files (v1, v2 names) that exists.
func (cg *cgroupFiles) text(ctl, ws string, files ...string) string {
	for _, f := range files {
		if p := cg.path(ctl, ws, f); p != "" {
			if b, err := os.ReadFile(p); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	return "(none)"
}

// int is text as a number; "max" and errors are -1.
func (cg *cgroupFiles) int(ctl, ws string, files ...string) int64 {
	v, err := strconv.ParseInt(cg.text(ctl, ws, files...), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// keyed reads the "key N" line of a flat-keyed cgroup file.
func (cg *cgroupFiles) keyed(ctl, ws, file, key string) int64 {
	return keyed(cg.path(ctl, ws, file), key)
}

func keyed(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// oomKills counts the OOM kills in ws so far: v2's memory.events of the
// workspace (hierarchical); on v1 the workspace's memory.oom_control and
// those of its leaves still present, added up.
func (cg *cgroupFiles) oomKills(ws string) int64 {
	if p := cg.path("memory", ws, "memory.events"); p != "" {
		return keyed(p, "oom_kill")
	}
	p := cg.path("memory", ws, "memory.oom_control")
	if p == "" {
		return 0
	}
	return keyedTree(p, "oom_kill")
}

// forksRefused counts the forks the pids controller refused in ws: its
// pids.events and its leaves' still present, added up.
func (cg *cgroupFiles) forksRefused(ws string) int64 {
	p := cg.path("pids", ws, "pids.events")
	if p == "" {
		return 0
	}
	return keyedTree(p, "max")
}

// keyedTree adds up key of the cgroup file p and of the same file of each
// of its leaves still present.
func keyedTree(p, key string) int64 {
	n := keyed(p, key)
	leaves, _ := filepath.Glob(filepath.Join(filepath.Dir(p), "*", filepath.Base(p)))
	for _, l := range leaves {
		n += keyed(l, key)
	}
	return n
}

// cpuTimes reads each CPU's busy and total jiffies from /proc/stat.
func cpuTimes() [][2]uint64 {
	b, _ := os.ReadFile("/proc/stat")
	var out [][2]uint64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		var busy, total uint64
		for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
			n, _ := strconv.ParseUint(v, 10, 64)
			total += n
			if i != 3 && i != 4 {
				busy += n
			}
		}
		out = append(out, [2]uint64{busy, total})
	}
	return out
}

// busy is each CPU's busy share between two cpuTimes.
func busy(before, after [][2]uint64) string {
	var out []string
	for i := range min(len(before), len(after)) {
		d := after[i][1] - before[i][1]
		if d == 0 {
			d = 1
		}
		out = append(out, fmt.Sprintf("cpu%d %.0f%%", i, 100*float64(after[i][0]-before[i][0])/float64(d)))
	}
	return strings.Join(out, ", ")
}

// cpuQuota is the workspace's CPU quota as "quota/period µs".
func (cg *cgroupFiles) cpuQuota(ws string) string {
	if q := cg.text("cpu", ws, "cpu.cfs_quota_us"); q != "(none)" {
		return q + "/" + cg.text("cpu", ws, "cpu.cfs_period_us") + " µs"
	}
	return cg.text("cpu", ws, "cpu.max")
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpusOnline() int {
	m, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*")
	return len(m)
}

// logLines returns the lines of the file that contain s.
func logLines(path, s string) []string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// decode is a base64 stream as text ("" when it is not base64).
func decode(b64 string) string {
	b, _ := base64.StdEncoding.DecodeString(b64)
	return string(b)
}

// decodeJSON decodes a 200 answer's body into out and closes it.
func decodeJSON(resp *http.Response, out any) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.500s", resp.StatusCode, body)
	}
	return json.Unmarshal(body, out)
}
