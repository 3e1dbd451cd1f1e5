# forkvm: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export FORKVM_HOME ?= /var/lib/forkvm

.PHONY: setup build demo test lint bench-registry bench-ui bench-boot bench-spawn bench-branch bench-load bench-network bench-chain bench-images bench-jail bench-volumes bench-fanout bench-branchpoint bench-cluster bench-timetravel

## Install everything (QEMU >= 10, kernel, image, toolchains) — idempotent and fast when done.
setup:
	bash scripts/setup.sh

build: setup
	$(CARGO) build --release -p forkvm-cli

## Set up, then boot the default image, run Python in it, and show the result.
## Only the CLI is compiled, in the quick `demo` profile (Cargo.toml).
demo: setup
	$(CARGO) build --profile demo -p forkvm-cli
	FORKVM=target/demo/forkvm bash scripts/demo.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Set up and run every test: lint, unit tests, the VM integration tests under the real QEMU,
## the SDK suites, the 3-node Ray cluster test, the E2B and MCP compatibility suites and the dashboard in a real browser against
## a real daemon, and the API fuzzer. scripts/test-all.sh builds the tests once, then runs these
## in lanes side by side (TEST_JOBS at a time), with a log per lane and a table of their times.
test: setup
	CARGO=$(CARGO) bash scripts/test-all.sh

## Benchmarks (not part of `make test`).
bench-boot: build
	bash bench/boot/run.sh

bench-spawn: build
	bash bench/spawn/run.sh

bench-branch: build
	bash bench/branch/run.sh

bench-load: build
	bash bench/load/run.sh

bench-network: build
	bash bench/network/run.sh

bench-chain: build
	bash bench/chain/run.sh

bench-images: build
	bash bench/images/run.sh

bench-registry: build
	bash bench/registry/run.sh

bench-jail: build
	bash bench/jail/run.sh

bench-volumes: build
	bash bench/volumes/run.sh

bench-fanout: build
	bash bench/fanout/run.sh

bench-branchpoint: build
	bash bench/branchpoint/run.sh

bench-cluster: build
	bash bench/cluster/run.sh

bench-timetravel: build
	bash bench/timetravel/run.sh

bench-ui: build
	bash bench/ui/run.sh
