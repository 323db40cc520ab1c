# syntax=docker/dockerfile:1
# sandgate: a multi-stage build. The runtime image is Debian slim with what
# the local provider needs (bwrap, prlimit from util-linux) and curl for the
# health check; it runs as the unprivileged user sandgate (uid 10001).
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
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap util-linux ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/sandgate --shell /usr/sbin/nologin sandgate \
 && mkdir -p /var/lib/sandgate /etc/sandgate \
 && chown sandgate:sandgate /var/lib/sandgate
COPY --from=build /out/sandgate /usr/local/bin/sandgate
COPY --from=build /out/sandgate-guest /usr/local/bin/sandgate-guest
USER sandgate
WORKDIR /var/lib/sandgate
VOLUME /var/lib/sandgate
# 8443: the v1 API (TLS). The operator listener (8444) binds loopback only.
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/sandgate"]
CMD ["serve", "--config", "/etc/sandgate/sandgate.yaml"]
