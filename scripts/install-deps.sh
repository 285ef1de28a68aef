#!/usr/bin/env bash
# Installs what building and testing pvsched needs on Debian 12, idempotently:
# apt packages only when one is missing, Rust components only when absent.
set -euo pipefail

APT_PACKAGES=(
	build-essential pkg-config clang libelf-dev zlib1g-dev
	qemu-system-x86 linux-image-cloud-amd64 linux-headers-cloud-amd64
	busybox-static cpio rt-tests stress-ng linux-perf bpftool xz-utils
	fonts-dejavu-core
	dkms libvirt-daemon-system libvirt-clients
)

as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "install-deps: apt packages missing: ${missing[*]}"
	as_root apt-get update -qq
	# Installing must not start daemons (libvirtd, virtlogd): this prepares a
	# build/test machine. Where no policy-rc.d says so already, one that denies
	# every start exists for the length of the install only.
	policy=/usr/sbin/policy-rc.d
	if [ ! -e "$policy" ]; then
		trap 'as_root rm -f "$policy"' EXIT
		printf '#!/bin/sh\n# pvsched install-deps.sh: no service starts during apt-get\nexit 101\n' |
			as_root tee "$policy" >/dev/null
		as_root chmod 755 "$policy"
	fi
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	if [ -n "$(trap -p EXIT)" ]; then
		as_root rm -f "$policy"
		trap - EXIT
	fi
	echo "install-deps: apt packages installed"
fi

if ! command -v cargo >/dev/null 2>&1; then
	if [ -x "$HOME/.cargo/bin/cargo" ]; then
		export PATH="$HOME/.cargo/bin:$PATH"
	else
		echo "install-deps: cargo not found; installing Debian's rust toolchain"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc rustfmt rust-clippy >/dev/null
	fi
fi
if command -v rustup >/dev/null 2>&1; then
	for c in clippy rustfmt; do
		rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
	done
fi
cargo fetch --locked -q 2>/dev/null || cargo fetch -q
# The KVM host VM's kernel and QEMU, into a cache (nothing installed).
"$(dirname "$0")/fetch-hostvm.sh"
echo "install-deps: ok"
