package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/broker"
	"go.yaml.in/yaml/v3"
)

// Paths of the shipped observability files, from the repository's root.
var (
	promDir       = filepath.Join("deploy", "prometheus")
	alertsFile    = filepath.Join(promDir, "alerts.yml")
	dashboardFile = filepath.Join("deploy", "grafana", "sandgate.json")
)

// grafanaDatasourceUID is the uid of the provisioned Prometheus data
// source (deploy/grafana/provisioning/datasources).
const grafanaDatasourceUID = "prometheus"

// composeFile is the part of docker-compose.yml the checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Command     any               `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
		NetworkMode string            `yaml:"network_mode"`
		User        string            `yaml:"user"`
		CapAdd      []string          `yaml:"cap_add"`
		CapDrop     []string          `yaml:"cap_drop"`
		Devices     []string          `yaml:"devices"`
		DeviceRules []string          `yaml:"device_cgroup_rules"`
		Cgroup      string            `yaml:"cgroup"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

// TestComposeFile validates docker-compose.yml the way `docker compose
// config` would, for what this repository relies on (Docker cannot run
// here): the services, their health checks and depends_on conditions,
// Redis's AOF on a named volume, every named volume declared, every
// mounted file present, the broker's mounted config loading with the
// compose environment, and Prometheus scraping the operator listener.
func TestComposeFile(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"sandgate", "redis", "otel-collector", "prometheus", "jaeger", "tls-init", "grafana"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("docker-compose.yml has no service %s", name)
		}
	}
	for name, s := range c.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("service %s has neither image nor build", name)
		}
		for dep, d := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, dep)
			}
			switch d.Condition {
			case "service_started", "service_completed_successfully":
			case "service_healthy":
				if c.Services[dep].Healthcheck == nil {
					t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
				}
			default:
				t.Errorf("service %s depends on %s with condition %q", name, dep, d.Condition)
			}
		}
		if hc := s.Healthcheck; hc != nil && (len(hc.Test) < 2 || (hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL")) {
			t.Errorf("service %s's healthcheck test %v does not start with CMD or CMD-SHELL", name, hc.Test)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			switch {
			case strings.HasPrefix(src, "."):
				if _, err := os.Stat(filepath.Join(root, src)); err != nil {
					t.Errorf("service %s mounts %s: %v", name, src, err)
				}
			case filepath.IsAbs(src):
				// A host path (the cgroup hierarchy): it exists on a Linux host.
				if _, err := os.Stat(src); err != nil {
					t.Errorf("service %s mounts the host's %s: %v", name, src, err)
				}
			default:
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("service %s mounts the named volume %s, which is not declared", name, src)
				}
			}
		}
		if m, ok := strings.CutPrefix(s.NetworkMode, "service:"); ok {
			if _, exists := c.Services[m]; !exists {
				t.Errorf("service %s shares the network of %s, which is not a service", name, m)
			}
			if len(s.Ports) > 0 {
				t.Errorf("service %s shares a network namespace and cannot publish ports", name)
			}
		}
	}

	sg := c.Services["sandgate"]
	if sg.Healthcheck == nil || !slices.ContainsFunc(sg.Healthcheck.Test, func(s string) bool { return strings.HasSuffix(s, "/readyz") }) {
		t.Errorf("sandgate's healthcheck does not probe /readyz")
	}
	for dep, cond := range map[string]string{"redis": "service_healthy", "tls-init": "service_completed_successfully", "otel-collector": "service_started"} {
		if got := sg.DependsOn[dep].Condition; got != cond {
			t.Errorf("sandgate depends on %s with %q; want %q", dep, got, cond)
		}
	}
	if sg.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "" {
		t.Errorf("sandgate has no OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if c.Services["prometheus"].NetworkMode != "service:sandgate" {
		t.Errorf("prometheus does not share sandgate's network namespace: it cannot reach the loopback operator listener")
	}

	rd := c.Services["redis"]
	cmd := strings.Join(anyStrings(rd.Command), " ")
	if !strings.Contains(cmd, "--appendonly yes") || !strings.Contains(cmd, "--appendfsync everysec") {
		t.Errorf("redis runs %q; want AOF with appendfsync everysec", cmd)
	}
	if !slices.Contains(rd.Volumes, "redis-data:/data") {
		t.Errorf("redis's /data is not the named volume redis-data: %v", rd.Volumes)
	}

	// The broker's mounted config loads, with the compose environment.
	var cfgPath string
	for _, v := range sg.Volumes {
		if src, dst, _ := strings.Cut(v, ":"); strings.HasPrefix(dst, "/etc/sandgate/sandgate.yaml") {
			cfgPath = filepath.Join(root, src)
		}
	}
	env := map[string]string{}
	for k, v := range sg.Environment {
		env[k] = v
	}
	env["SANDGATE_OPERATOR_TOKEN_ADMIN"] = "sgo_compose-test-token"
	getenv := func(k string) string { return env[k] }
	cfg, err := broker.LoadConfig(cfgPath, getenv)
	if err != nil {
		t.Fatalf("the compose's sandgate config: %v", err)
	}
	if _, err := cfg.OperatorTokens(getenv); err != nil {
		t.Errorf("the compose's operators: %v", err)
	}
	if cfg.Redis.Addr != "redis:6379" || !broker.IsLoopback(cfg.AdminListen) || !strings.HasSuffix(cfg.AdminListen, ":8444") {
		t.Errorf("compose config: redis %q, admin_listen %q; want redis:6379 and loopback :8444", cfg.Redis.Addr, cfg.AdminListen)
	}

	prom, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(prom, &pc); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(pc.ScrapeConfigs) == 0 || pc.ScrapeConfigs[0].MetricsPath != "/metrics" || len(pc.ScrapeConfigs[0].StaticConfigs) == 0 ||
		!slices.Contains(pc.ScrapeConfigs[0].StaticConfigs[0].Targets, cfg.AdminListen) {
		t.Errorf("prometheus.yml does not scrape /metrics on %s: %+v", cfg.AdminListen, pc)
	}
	// Prometheus loads the alert rules from the directory compose mounts.
	if !slices.Contains(c.Services["prometheus"].Volumes, "./deploy/prometheus:/etc/prometheus:ro") || !slices.Contains(pc.RuleFiles, "alerts.yml") {
		t.Errorf("prometheus does not load deploy/prometheus/alerts.yml: volumes %v, rule_files %v", c.Services["prometheus"].Volumes, pc.RuleFiles)
	}
	checkGrafana(t, root, c)

	otel, err := os.ReadFile(filepath.Join(root, "deploy", "otel-collector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var oc struct {
		Receivers map[string]any `yaml:"receivers"`
		Service   struct {
			Pipelines map[string]struct {
				Receivers []string `yaml:"receivers"`
				Exporters []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
		Exporters map[string]any `yaml:"exporters"`
	}
	if err := yaml.Unmarshal(otel, &oc); err != nil {
		t.Fatalf("otel-collector.yaml: %v", err)
	}
	tp := oc.Service.Pipelines["traces"]
	if _, ok := oc.Receivers["otlp"]; !ok || !slices.Contains(tp.Receivers, "otlp") || len(tp.Exporters) == 0 {
		t.Errorf("otel-collector.yaml has no traces pipeline from the otlp receiver: %+v", oc)
	}
	for _, e := range tp.Exporters {
		if _, ok := oc.Exporters[e]; !ok {
			t.Errorf("otel-collector.yaml: the traces pipeline names exporter %s, which is not configured", e)
		}
	}

	// The README's production section shows it.
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"docker compose up", "http://localhost:9090", "http://localhost:16686", "/readyz", "/livez"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not mention %s", want)
		}
	}
}

// checkGrafana checks the grafana service: its provisioning directory
// and the dashboard mounted where the dashboard provider reads, its data
// source reaching Prometheus (which runs in the sandgate service's network
// namespace), and its start once Prometheus is healthy.
func checkGrafana(t *testing.T, root string, c composeFile) {
	t.Helper()
	g := c.Services["grafana"]
	mounts := map[string]string{} // container path → source
	for _, v := range g.Volumes {
		src, dst, _ := strings.Cut(v, ":")
		dst, _, _ = strings.Cut(dst, ":")
		mounts[dst] = src
	}
	if mounts["/etc/grafana/provisioning"] != "./deploy/grafana/provisioning" {
		t.Errorf("grafana does not mount ./deploy/grafana/provisioning at /etc/grafana/provisioning: %v", g.Volumes)
	}
	if g.DependsOn["prometheus"].Condition != "service_healthy" {
		t.Errorf("grafana does not wait for a healthy prometheus: %+v", g.DependsOn)
	}
	prov := filepath.Join(root, "deploy", "grafana", "provisioning")
	var dp struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	b, err := os.ReadFile(filepath.Join(prov, "dashboards", "sandgate.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &dp); err != nil || len(dp.Providers) != 1 || dp.Providers[0].Type != "file" {
		t.Fatalf("grafana dashboard provisioning: %v, %+v; want one file provider", err, dp)
	}
	if src := mounts[dp.Providers[0].Options.Path+"/sandgate.json"]; src != "./"+filepath.ToSlash(dashboardFile) {
		t.Errorf("grafana's dashboard provider reads %s, where compose mounts %q, not ./%s", dp.Providers[0].Options.Path, src, dashboardFile)
	}
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			UID  string `yaml:"uid"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	if b, err = os.ReadFile(filepath.Join(prov, "datasources", "prometheus.yml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("grafana datasource provisioning: %v, %+v; want one data source", err, ds)
	}
	d := ds.Datasources[0]
	promNet, _ := strings.CutPrefix(c.Services["prometheus"].NetworkMode, "service:")
	if d.Type != "prometheus" || d.UID != grafanaDatasourceUID || d.URL != "http://"+promNet+":9090" {
		t.Errorf("grafana's data source = %+v; want type prometheus, uid %s, url http://%s:9090 (prometheus runs in %s's network namespace)",
			d, grafanaDatasourceUID, promNet, promNet)
	}
}

func anyStrings(v any) []string {
	switch x := v.(type) {
	case string:
		return strings.Fields(x)
	case []any:
		var out []string
		for _, e := range x {
			s, _ := e.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// TestDockerfile checks the Dockerfile without building it: two stages,
// a builder on the go.mod's Go release, a runtime with bwrap and prlimit
// for the local provider and curl for the health check, a non-root user,
// the version stamped, and serve as the default command.
func TestDockerfile(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, l := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			parts := strings.Split(strings.TrimSpace(v), ".")
			goVersion = strings.Join(parts[:min(2, len(parts))], ".")
		}
	}
	var froms []string
	for _, l := range strings.Split(df, "\n") {
		if f, ok := strings.CutPrefix(l, "FROM "); ok {
			froms = append(froms, f)
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:"+goVersion) || !strings.Contains(froms[0], " AS build") {
		t.Errorf("Dockerfile stages %q; want a golang:%s builder and a runtime stage", froms, goVersion)
	}
	for _, want := range []string{"bubblewrap", "util-linux", "e2fsprogs", "curl", "USER root", "-X main.buildCommit=", "-X main.buildVersion=",
		`ENTRYPOINT ["/usr/local/bin/sandgate"]`, `CMD ["serve", "--config", "/etc/sandgate/sandgate.yaml"]`, "COPY --from=build"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile has no %s", want)
		}
	}
}

// TestOtelCollectorConfig runs the OpenTelemetry Collector's own
// `validate` on deploy/otel-collector.yaml, with the components the
// config uses (deploy/otelcheck, a module of its own), and checks that it
// refuses a broken copy: a pipeline naming an exporter that is not
// configured.
func TestOtelCollectorConfig(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "otelcheck")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(root, "deploy", "otelcheck")
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build deploy/otelcheck: %v\n%s", err, out)
	}
	shipped := filepath.Join(root, "deploy", "otel-collector.yaml")
	if out, err := exec.Command(bin, "validate", "--config", shipped).CombinedOutput(); err != nil {
		t.Errorf("the collector refuses deploy/otel-collector.yaml: %v\n%s", err, out)
	}
	b, err := os.ReadFile(shipped)
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "broken.yaml")
	if err := os.WriteFile(broken, []byte(strings.Replace(string(b), "exporters: [otlp/jaeger]", "exporters: [otlp/nowhere]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "validate", "--config", broken).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"otlp/nowhere"`) {
		t.Errorf("the collector's validate on a pipeline naming a missing exporter: %v\n%s; want a refusal naming it", err, out)
	}
}
