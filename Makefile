# The README's test command: `make test` installs what the tests need on a
# fresh Debian machine (redis-server, bubblewrap, e2fsprogs and util-linux for
# the local provider's disk images, protoc, jq and curl for the README's shell
# blocks and the egress tests, openssl and git for the egress tests (SNI
# checks, a clone through the proxy),
# chromium for the console's browser tests) and runs every test with -race.
GO ?= go
APT_PACKAGES := redis-server redis-tools bubblewrap protobuf-compiler e2fsprogs util-linux mount jq curl openssl git chromium
# promtool (Debian's prometheus package), for the shipped alert rules and
# their unit tests.
APT_PACKAGES += prometheus
# systemd-analyze, for verifying deploy/systemd/sandgate.service.
APT_PACKAGES += systemd
# A static busybox, the content of the OCI images the image tests build.
APT_PACKAGES += busybox-static

.PHONY: test deps vet bench figures generate

deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v protoc >/dev/null 2>&1 || missing="$$missing protobuf-compiler"; \
	PATH="$$PATH:/usr/sbin:/sbin"; \
	command -v mkfs.ext4 >/dev/null 2>&1 || missing="$$missing e2fsprogs"; \
	command -v prlimit >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v mount >/dev/null 2>&1 || missing="$$missing mount"; \
	command -v jq >/dev/null 2>&1 || missing="$$missing jq"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v setpriv >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v git >/dev/null 2>&1 || missing="$$missing git"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	[ -x /bin/busybox ] || missing="$$missing busybox-static"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# The broker and, beside it (where the vendor providers look for it), the
# static guest agent they deliver into every vendor guest (docs/guest.md).
.PHONY: build
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/ ./cmd/sandgate ./cmd/sandgate-guest

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	$(GO) vet ./...
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) run $(STATICCHECK) ./...

# -timeout bounds each package: the slowest (cmd/sandgate,
# providers/flymachines) take 5 to 6 minutes on 2 cores, so 30m leaves
# room for a CI machine several times slower.
test: deps vet
	$(GO) test -race -count=1 -timeout 30m ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem ./gateway/ ./store/

# Every figure of docs/benchmarks.md that issues 10 and 17 ask for, one after
# another in one run on one machine (about 15 minutes; run it on a quiet
# host, as root, for the local provider's cgroups): each prints its own
# ratio against a baseline measured beside it. The idle figure runs first,
# while nothing the others started (a noisy neighbour's cleanup, writeback)
# can still be running in its windows. A figure that misses its
# target fails its command; the others still run (the leading "-").
LOAD := $(GO) run ./cmd/sandgate-load
figures: deps
	@echo "== host: $$(nproc) CPUs, $$(uname -r), $$($(GO) version), load $$(cut -d' ' -f1-3 /proc/loadavg), $$(date -u +%FT%TZ)"
	-$(LOAD) -idle -n 1000 -window 30s
	-$(GO) test -run '^$$' -bench 'LeaseVsTLSFloor' -benchtime 3s -count 3 ./gateway/
	-$(GO) test -run '^$$' -bench 'ExecLocalVsBwrap' -benchtime 100x -count 3 ./gateway/
	-$(GO) test -run '^$$' -bench 'Export' -benchtime 1x -benchmem ./billing/
	-$(LOAD) -acquire -pairs 2000 -c 8 -rounds 3
	-$(LOAD) -ttfc -n 50
	-$(LOAD) -files -c 16 -size 8388608
	-$(LOAD) -execs 40 -bytes 4194304
	-$(LOAD) -noisy -n 200
	@echo "== done: load $$(cut -d' ' -f1-3 /proc/loadavg), $$(date -u +%FT%TZ)"

# Regenerate the Modal provider's gRPC code with the pinned generators
# (providers/modal/proto/README.md); protoc comes from deps.
PROTOC_GEN_GO := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

generate: deps
	GOFLAGS= $(GO) install $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(GO) generate ./providers/modal/proto/
