#!/usr/bin/env bash
# Builds the two Debian packages into target/packages/ and prints their paths:
#   pvsched_<ver>_<arch>.deb    host: pvschedd, pvschedctl, unit, config, libvirt hook
#                               (cargo-deb, [package.metadata.deb] in crates/host/Cargo.toml)
#   pvsched-dkms_<ver>_all.deb  guest: the kernel module as DKMS source
#                               (dpkg-deb, templates in packaging/dkms/)
# Installs cargo-deb first when `cargo deb` is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="$HOME/.cargo/bin:$PATH"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET_DIR/packages

die() {
	echo "build-packages: $*" >&2
	exit 1
}

# One version for both packages: the workspace's must be the DKMS one, or the
# host and guest packages of one release would carry different numbers.
ws_version=$(awk '
	/^\[/ { in_ws = ($0 == "[workspace.package]") }
	in_ws && /^version[[:space:]]*=/ { gsub(/.*=[[:space:]]*"|".*/, ""); print; exit }
' Cargo.toml)
dkms_version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"$/\1/p' guest/dkms.conf)
[ -n "$ws_version" ] || die "no version in [workspace.package] of Cargo.toml"
[ -n "$dkms_version" ] || die "no PACKAGE_VERSION in guest/dkms.conf"
if [ "$ws_version" != "$dkms_version" ]; then
	die "version mismatch: Cargo.toml [workspace.package] version is $ws_version but guest/dkms.conf PACKAGE_VERSION is $dkms_version; make them equal"
fi
VERSION=$ws_version

for tool in cargo dpkg-deb make; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found (run scripts/install-deps.sh)"
done
if ! cargo deb --version >/dev/null 2>&1; then
	echo "build-packages: installing cargo-deb"
	cargo install cargo-deb --locked
fi

mkdir -p "$OUT"
rm -f "$OUT"/pvsched_*.deb "$OUT"/pvsched-dkms_*.deb

# Host package. pvschedctl belongs to another crate, so cargo-deb (which only
# builds the crate it packages) gets --no-build after both are built here.
# --strip: profile.release keeps line tables (debug = 1) for profiling, which
# cargo-deb would otherwise ship.
cargo build --release -p pvsched-host -p pvsched-ctl
host_deb=$(cargo deb -p pvsched-host --no-build --strip --output "$OUT" | tail -n 1)
[ -f "$host_deb" ] || die "cargo deb did not report the .deb it wrote (got: $host_deb)"

# Guest package: the self-contained DKMS tree from guest/Makefile under
# /usr/src/pvsched-<ver>, plus maintainer scripts that drive dkms.
stage=$TARGET_DIR/pkg-dkms/pvsched-dkms
rm -rf "$stage"
umask 022
make -s --no-print-directory -C guest dkms-tree DKMS_TREE="$stage/usr/src/pvsched-$VERSION" >/dev/null
install -D -m 644 packaging/dkms/copyright "$stage/usr/share/doc/pvsched-dkms/copyright"
mkdir -p "$stage/DEBIAN"
installed_kb=$(du -sk "$stage/usr" | cut -f1)
sed -e "s/@VERSION@/$VERSION/g" -e "s/@INSTALLED_SIZE@/$installed_kb/g" \
	packaging/dkms/control >"$stage/DEBIAN/control"
for script in postinst prerm; do
	sed -e "s/@VERSION@/$VERSION/g" "packaging/dkms/$script" >"$stage/DEBIAN/$script"
	chmod 755 "$stage/DEBIAN/$script"
done
if grep -rq '@[A-Z_]*@' "$stage/DEBIAN"; then
	die "unsubstituted placeholder in $stage/DEBIAN"
fi
dkms_deb=$OUT/pvsched-dkms_${VERSION}_all.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$dkms_deb" >/dev/null

echo "$host_deb"
echo "$dkms_deb"
