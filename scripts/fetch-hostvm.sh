#!/usr/bin/env bash
# Fetches what the KVM host VM boots, into a cache, installing nothing on
# this machine (crates/hostvm/README.md):
#   - a Debian 13 backports cloud kernel with KVM and sched_ext
#     (linux-binary-<v>+deb13-cloud-amd64 and linux-modules-<same>),
#   - Debian 12 backports' QEMU (qemu-system-x86, -common, -data), which runs
#     the host VM under TCG (Debian 12's own QEMU 7.2 crashed its kernel under
#     multi-threaded TCG; the QEMU inside the host VM stays the system's).
# Idempotent: a complete cache is left alone. Fails naming what was asked
# when a package cannot be found or fetched.
#
# Environment:
#   PVSCHED_HOSTVM_CACHE    cache folder [<repo>/target/pvsched-hostvm/pkgs]
#   PVSCHED_HOSTVM_KERNEL   kernel version prefix [7.3.]: the newest
#                           linux-binary-<prefix>*+deb13-cloud-amd64 is taken
#   PVSCHED_DEBIAN_MIRROR   [the URI of this machine's Debian source, else
#                           http://deb.debian.org/debian]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${PVSCHED_HOSTVM_CACHE:-$root/target/pvsched-hostvm/pkgs}"
want="${PVSCHED_HOSTVM_KERNEL:-7.3.}"

die() {
	echo "fetch-hostvm: $*" >&2
	exit 1
}

# The Debian mirror this machine already uses (deb822 or one-line sources).
mirror="${PVSCHED_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
	mirror="$(grep -hs '^URIs:.*debian$' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')"
	[ -n "$mirror" ] || mirror="$(grep -hs '^deb .*debian ' /etc/apt/sources.list | head -1 | awk '{print $2}')"
	[ -n "$mirror" ] || mirror="http://deb.debian.org/debian"
fi

mkdir -p "$cache"
# A complete cache has a stamp naming what it holds.
if [ -f "$cache/kernel.stamp" ] && [ -f "$cache/qemu.stamp" ]; then
	k="$(cat "$cache/kernel.stamp")"
	case "$k" in
	"$want"*) echo "fetch-hostvm: cached: kernel $k, $(cat "$cache/qemu.stamp")"; exit 0 ;;
	esac
fi

# apt with a private configuration: one suite, its own lists and cache.
apt_for() { # suite -> prints the -o options
	local suite="$1" dir="$cache/apt/$1"
	mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
	echo "deb $mirror $suite main" >"$dir/sources.list"
	echo "-o Dir::Etc::sourcelist=$dir/sources.list -o Dir::Etc::sourceparts=/dev/null" \
		"-o Dir::State::Lists=$dir/lists -o Dir::Cache=$dir/cache" \
		"-o APT::Sandbox::User=root -o Debug::NoLocking=1"
}

update() { # suite
	local opts
	opts="$(apt_for "$1")"
	# shellcheck disable=SC2086
	apt-get $opts -qq update || die "apt-get update of $mirror $1 failed"
}

download() { # suite dir package...
	local suite="$1" dir="$2" opts
	shift 2
	opts="$(apt_for "$suite")"
	mkdir -p "$dir"
	# shellcheck disable=SC2086
	(cd "$dir" && apt-get $opts -qq download "$@") ||
		die "could not download $* from $mirror $suite"
}

extract() { # dir -> every .deb in it into dir/root
	local d
	rm -rf "$1/root"
	mkdir -p "$1/root"
	for d in "$1"/*.deb; do
		dpkg-deb -x "$d" "$1/root" || die "dpkg-deb -x $d failed"
	done
}

# --- the kernel -------------------------------------------------------------
update trixie-backports
opts="$(apt_for trixie-backports)"
# shellcheck disable=SC2086
version="$(apt-cache $opts pkgnames linux-binary- |
	sed -n "s/^linux-binary-\(${want//./\\.}[0-9][^ ]*+deb13-cloud-amd64\)$/\1/p" |
	sort -V | tail -1)"
[ -n "$version" ] ||
	die "no linux-binary-${want}*+deb13-cloud-amd64 in $mirror trixie-backports (PVSCHED_HOSTVM_KERNEL=$want)"
kdir="$cache/kernel-$version"
if [ ! -f "$kdir/root/usr/lib/modules/$version/vmlinuz" ]; then
	rm -rf "$kdir"
	download trixie-backports "$kdir" "linux-binary-$version" "linux-modules-$version"
	extract "$kdir"
	rm -f "$kdir"/*.deb
	[ -f "$kdir/root/usr/lib/modules/$version/vmlinuz" ] ||
		die "linux-binary-$version holds no usr/lib/modules/$version/vmlinuz"
fi
echo "$version" >"$cache/kernel.stamp.new"

# --- QEMU for the host VM ---------------------------------------------------
update bookworm-backports
opts="$(apt_for bookworm-backports)"
# shellcheck disable=SC2086
qver="$(apt-cache $opts show qemu-system-x86 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)"
[ -n "$qver" ] || die "no qemu-system-x86 in $mirror bookworm-backports"
qdir="$cache/qemu"
if [ "$(cat "$qdir/version" 2>/dev/null)" != "$qver" ]; then
	rm -rf "$qdir"
	download bookworm-backports "$qdir" "qemu-system-x86=$qver" "qemu-system-common=$qver" "qemu-system-data=$qver"
	extract "$qdir"
	rm -f "$qdir"/*.deb
	[ -x "$qdir/root/usr/bin/qemu-system-x86_64" ] || die "qemu-system-x86 $qver holds no usr/bin/qemu-system-x86_64"
	echo "$qver" >"$qdir/version"
fi
missing="$(ldd "$qdir/root/usr/bin/qemu-system-x86_64" | grep 'not found' || true)"
[ -z "$missing" ] || die "QEMU $qver from bookworm-backports needs libraries this machine lacks: $missing"

mv "$cache/kernel.stamp.new" "$cache/kernel.stamp"
echo "qemu $qver" >"$cache/qemu.stamp"
rm -rf "$cache/apt"
echo "fetch-hostvm: kernel $version, qemu $qver in $cache"
