# syntax=docker/dockerfile:1
#
# t3code-mcp in a container: a static binary on distroless, running as nonroot.
#
#   make image     # = docker build -t t3code-mcp --build-arg VERSION=$(git describe --tags --always --dirty) .
#   docker run -p 127.0.0.1:8000:8000 -v ./t3code.toml:/config/t3code.toml:ro \
#     -v t3code-mcp-data:/data -e T3_MAC_TOKEN t3code-mcp
#
# See docs/deploy.md (and docker-compose.example.yml).

# ---- build ---------------------------------------------------------------
# go.mod asks for go 1.26.8; an older 1.26.x image fetches that toolchain itself (GOTOOLCHAIN=auto).
FROM golang:1.26 AS build
ENV GOTOOLCHAIN=auto
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version comes from `git describe` on the host (.git stays out of the build context): `make
# image` passes it; a plain `docker build` without --build-arg reports "dev".
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/t3code-mcp ./cmd/t3code-mcp \
 && mkdir -p /out/data /out/config

# ---- runtime -------------------------------------------------------------
# distroless static: no shell, no package manager, CA certificates and tzdata included;
# the nonroot tag runs as uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/t3code-mcp /t3code-mcp
# /data must belong to the runtime user: a new named volume copies this ownership.
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/config /config
USER 65532:65532

ENV T3CODE_MCP_CONFIG=/config/t3code.toml \
    T3CODE_MCP_STATE_DIR=/data \
    T3CODE_MCP_HOST=0.0.0.0 \
    T3CODE_MCP_PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# `healthcheck` GETs http://127.0.0.1:$T3CODE_MCP_PORT/healthz and exits 0 on HTTP 200.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/t3code-mcp", "healthcheck"]

ENTRYPOINT ["/t3code-mcp"]
CMD ["serve"]
