# t3code-mcp — every task a developer or CI runs. `make help` lists them.
SHELL := /usr/bin/env bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s
SHARED_FIXTURES ?= ../shared/fixtures
# The version the binary reports (banner, `version`, --version, MCP serverInfo.version).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: help sync generate gencheck fmtcheck vet staticcheck test scriptcheck check run build bench fuzz fuzz-short fixtures clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

sync: ## download modules and the pinned generator and lint tools
	$(GO) mod download
	$(GO) build -o /dev/null github.com/ogen-go/ogen/cmd/ogen github.com/ogen-go/ogen/cmd/jschemagen honnef.co/go/tools/cmd/staticcheck

generate: ## compile schema/ into gen/ (go generate in tools.go)
	$(GO) generate ./tools.go

gencheck: ## fail if regenerating would change gen/ (generated code must be committed and current)
	@./scripts/gencheck

fmtcheck: ## fail on files gofmt would change
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))"; \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The trace-join tools are modules of their own (golang.org/x/exp/trace is newer than the x/exp
# the main module pins): vetted here so that they build with the tree they measure.
TOOLMODS := scripts/tracejoin scripts/wakejoin scripts/gcmarks

vet: ## go vet (the main module and the trace-join tools' modules)
	$(GO) vet $(PKGS)
	@for m in $(TOOLMODS); do (cd $$m && $(GO) vet ./...) || exit 1; done

staticcheck: ## staticcheck (pinned in go.mod)
	$(GO) tool staticcheck $(PKGS)

# scripts/pg run starts a throwaway PostgreSQL for the run when T3CODE_MCP_TEST_DATABASE_URL is
# unset and PostgreSQL is installed (the PostgreSQL tests skip when neither is there, except under CI=true).
# Some tests build the connector binary (without -race): `go build` first fills the build cache,
# so that on a fresh machine the packages' tests do not each compile it within their own time
# limit. TESTTIMEOUT bounds each package's test binary (go test's default is 10 min; a fresh,
# slower machine running every package at once comes near it); it is a safety net, not a measure.
TESTTIMEOUT ?= 30m
test: ## all tests with the race detector (PostgreSQL tests included: scripts/pg)
	$(GO) build $(PKGS)
	./scripts/pg run $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(PKGS)

scriptcheck: ## tests of the shell scripts the tests and CI rely on (scripts/pgtest: scripts/pg)
	@./scripts/pgtest

check: fmtcheck vet staticcheck gencheck scriptcheck test fuzz-short ## everything CI runs

# A fixed count, not a time: Go 1.26's fuzzer can end a timed run with "context deadline exceeded"
# and no failing input (golang/go#75804); a count has no deadline to trip over.
fuzz-short: ## every fuzz target for 3,000 executions (part of check)
	@./scripts/fuzz 3000x

build: ## build bin/t3code-mcp, its version stamped from git describe
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/t3code-mcp ./cmd/t3code-mcp

.PHONY: image
image: ## build the container image t3code-mcp, its version stamped from git describe
	docker build -t t3code-mcp --build-arg VERSION=$(VERSION) .

run: build ## run the connector (T3CODE_MCP_CONFIG, ./t3code.toml, or the built-in demo machine)
	./bin/t3code-mcp serve

bench: ## Go benchmarks of the hot paths (BENCHTIME, default 200ms) and a short load run (docs/benchmarks.md)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(or $(BENCHTIME),200ms) $(PKGS)
	$(GO) run ./cmd/t3code-load -short

.PHONY: load
load: ## the full load run: 100 machines × 1,000 threads, 1,000 waits, 5,000 runs/s offered (minutes)
	$(GO) run ./cmd/t3code-load

fuzz: ## every fuzz target for FUZZTIME each (default 10s)
	@./scripts/fuzz "$(FUZZTIME)"

.PHONY: soak fuzz-long
SOAK ?= 3m
FUZZLONG ?= 30s

soak: ## soak: dispatch/wait/interrupt cycles with socket drops for SOAK (default 3m), RSS sampled (docs/reliability.md)
	T3CODE_MCP_SOAK_DURATION=$(SOAK) $(GO) test -count=1 -run '^TestSoak$$' -v -timeout 2h ./internal/app/

fuzz-long: ## every fuzz target for FUZZLONG each (default 30s; the figures in docs/reliability.md)
	@./scripts/fuzz "$(FUZZLONG)"

fixtures: ## refresh testdata/t3 from ../shared/fixtures (new recordings)
	rm -rf testdata/t3 && mkdir -p testdata/t3
	cp -r $(SHARED_FIXTURES)/. testdata/t3/
	chmod -R u+w testdata/t3

clean:
	rm -rf bin
