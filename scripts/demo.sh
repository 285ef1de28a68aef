#!/usr/bin/env bash
# make demo: the end-to-end bench, short preset. Builds the release binaries,
# runs vanilla / static-rt / pvsched on an idle and a loaded host in one
# QEMU guest, prints the table and the paths of the plots.
#
#   scripts/demo.sh [extra pvsched-bench options, e.g. --out DIR or --repeat 3]
#
# The full run behind BENCHMARKS.md: target/release/pvsched-bench (no --quick).
set -euo pipefail

cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if [ "$(id -u)" -ne 0 ]; then
	echo "demo: needs root (RT priorities, sched_setattr on QEMU's threads, BPF for pvschedd);" >&2
	echo "demo: run it as root, e.g. sudo make demo" >&2
	exit 1
fi

echo "demo: building release binaries (pvsched-bench, pvschedd, pvschedctl)"
cargo build --release -q -p pvsched-bench -p pvsched-host -p pvsched-ctl

echo "demo: running the quick preset (a few minutes; one progress line per phase)"
case " $* " in
*" --out "* | *" --out="*) exec target/release/pvsched-bench --quick "$@" ;;
esac
rm -rf bench-results/demo
exec target/release/pvsched-bench --quick --out bench-results/demo "$@"
