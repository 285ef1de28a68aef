# pvsched: two entry points.
#   make demo   the main job: an end-to-end run on this machine
#   make test   every test (installs what it needs first)

CARGO ?= cargo
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build test test-fast lint demo demo-rogue guest clean packages

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets --release
	$(MAKE) -C guest

guest: deps
	$(MAKE) -C guest

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Unit, property and end-to-end tests (the e2e ones boot QEMU guests).
# The binaries are built first: the daemon's e2e tests run pvschedctl too.
test: deps lint
	$(MAKE) -C guest check-warnings
	$(CARGO) build --workspace --bins --release
	scripts/build-packages.sh
	$(CARGO) test --workspace --release

# Unit and property tests only: no guest boots.
test-fast:
	$(CARGO) test --workspace --lib --bins

demo: deps
	@scripts/demo.sh

# A rogue guest (RT spin on every vCPU) beside a well-behaved one, quick preset.
demo-rogue: deps
	@scripts/demo.sh --scenario rogue --out bench-results/demo-rogue

# Debian packages in target/packages/: pvsched (host) and pvsched-dkms (guest).
packages: deps
	@scripts/build-packages.sh

clean:
	$(CARGO) clean
	$(MAKE) -C guest clean
