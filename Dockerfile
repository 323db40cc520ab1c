# syntax=docker/dockerfile:1
# sandgate: a multi-stage build. The runtime image is Debian slim with what
# the local provider needs (bwrap; prlimit and mount from util-linux;
# mkfs.ext4 from e2fsprogs for the workspaces' disk images) and curl for the
# health check. It runs as root, because the local provider does: it makes
# cgroups, loop-mounts disk images and maps each workspace to a uid of its
# own. docker-compose.yml grants it only the capabilities and devices that
# needs, each with its reason; cmd/sandgate/image_test.go runs this
# entrypoint with exactly those, outside Docker.
#
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t sandgate .

FROM golang:1.26-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
ARG COMMIT=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" \
      -o /out/sandgate ./cmd/sandgate
# The guest agent the vendor providers deliver into their guests: static,
# beside the broker, where it looks for it.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o /out/sandgate-guest ./cmd/sandgate-guest

FROM debian:trixie-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap util-linux e2fsprogs ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p -m 0700 /var/lib/sandgate /etc/sandgate
COPY --from=build /out/sandgate /usr/local/bin/sandgate
COPY --from=build /out/sandgate-guest /usr/local/bin/sandgate-guest
USER root
WORKDIR /var/lib/sandgate
VOLUME /var/lib/sandgate
# 8443: the v1 API (TLS). The operator listener (8444) binds loopback only.
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/sandgate"]
CMD ["serve", "--config", "/etc/sandgate/sandgate.yaml"]
