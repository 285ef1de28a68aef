#!/usr/bin/env bash
# Starts and stops a system libvirtd (with its virtlogd) on a host without
# systemd, for pvsched's libvirt end-to-end test (crates/host/tests/libvirt_e2e.rs).
#
#   scripts/libvirtd.sh start    start virtlogd and libvirtd unless running;
#                                restart libvirtd if its hooks or qemu.conf
#                                changed since it started; wait until
#                                `virsh -c qemu:///system version` answers
#   scripts/libvirtd.sh stop     stop only the daemons `start` started
#   scripts/libvirtd.sh status   print the daemons' PIDs
#
# `start` prints one line per daemon: `<name> <pid> <started|running|restarted>`.
# What it started is recorded in $STATE; `stop` reads it. A daemon that was
# running before `start` (or that `start` only restarted) is never stopped.
# Where systemd runs, the daemons are systemd's: use systemctl instead.
set -euo pipefail

STATE=/run/pvsched-test-libvirtd.started
# libvirtd's and virtlogd's own default PID files (`-d` writes them; removed
# on a clean exit).
LIBVIRTD_PIDFILE=/run/libvirtd.pid
VIRTLOGD_PIDFILE=/run/virtlogd.pid
QEMU_CONF=/etc/libvirt/qemu.conf
HOOKS_DIR=/etc/libvirt/hooks
CONF_MARK="# pvsched-test: libvirtd.sh"
WAIT_S=30

die() {
	echo "libvirtd.sh: $*" >&2
	exit 1
}

# The PID in pidfile $1 if that process runs and is named $2; else nothing.
running_pid() {
	local pidfile=$1 name=$2 pid
	[ -r "$pidfile" ] || return 0
	pid=$(tr -dc '0-9' <"$pidfile")
	[ -n "$pid" ] || return 0
	if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
		echo "$pid"
	fi
}

# Waits (bounded) until process $1 is gone.
wait_gone() {
	local pid=$1 i
	for ((i = 0; i < WAIT_S * 10; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.1
	done
	return 1
}

# Sends SIGTERM to $2 (PID of a daemon named $1) and waits until it is gone.
stop_pid() {
	local name=$1 pid=$2
	if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
		return 0
	fi
	kill -TERM "$pid"
	wait_gone "$pid" || die "$name ($pid) still running ${WAIT_S}s after SIGTERM"
}

# Starts daemon $1 (-d: it daemonizes) and prints its pid from pidfile $2.
# Its stdin and stdout are not this command substitution's pipe, so a
# daemon that keeps them open cannot hold the caller.
launch() {
	"$1" -d </dev/null >/dev/null
	wait_pidfile "$2" "$1"
}

# Waits (bounded) until pidfile $1 names a running $2, and prints the PID.
wait_pidfile() {
	local pidfile=$1 name=$2 i pid
	for ((i = 0; i < WAIT_S * 10; i++)); do
		pid=$(running_pid "$pidfile" "$name")
		if [ -n "$pid" ]; then
			echo "$pid"
			return 0
		fi
		sleep 0.1
	done
	die "$name did not write $pidfile within ${WAIT_S}s (see /var/log/libvirt/)"
}

wait_answering() {
	local i
	for ((i = 0; i < WAIT_S * 5; i++)); do
		if virsh -c qemu:///system version >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	die "libvirtd does not answer \`virsh -c qemu:///system version\` after ${WAIT_S}s"
}

record() {
	grep -qx "$1" "$STATE" 2>/dev/null || echo "$1" >>"$STATE"
}

# Kernels with RT group scheduling (CONFIG_RT_GROUP_SCHED=y; Debian's own
# kernels do not have it, this test machine's host kernel does) refuse
# SCHED_FIFO/RR with EPERM to any thread in a cpu cgroup whose
# cpu.rt_runtime_us is 0, and that is every cgroup libvirt creates for a
# domain (machine/<domain>/vcpuN): pvschedd could never boost a vCPU. Without
# systemd libvirt manages cgroupfs itself; leaving "cpu" out of its
# controllers keeps QEMU's threads in the root cpu cgroup, where RT works.
# The other controllers stay as libvirt's default. A qemu.conf that already
# sets cgroup_controllers is the administrator's: it is left alone. A running
# libvirtd sees the change once restarted (`stale` notices it).
configure() {
	[ -f /sys/fs/cgroup/cpu/cpu.rt_runtime_us ] || return 0
	[ -f "$QEMU_CONF" ] || die "$QEMU_CONF missing: apt-get install libvirt-daemon-system"
	if grep -qE '^[[:space:]]*cgroup_controllers[[:space:]]*=' "$QEMU_CONF"; then
		if ! grep -qF "$CONF_MARK" "$QEMU_CONF" &&
			grep -E '^[[:space:]]*cgroup_controllers[[:space:]]*=' "$QEMU_CONF" | grep -q '"cpu"'; then
			echo "libvirtd.sh: warning: $QEMU_CONF puts domains in cpu cgroups and this kernel has" \
				"RT group scheduling: vCPU threads cannot be made SCHED_FIFO/RR" >&2
		fi
		return 0
	fi
	{
		echo ""
		echo "$CONF_MARK: no \"cpu\" controller, so that vCPU threads stay in the root"
		echo "# cpu cgroup, where this kernel (CONFIG_RT_GROUP_SCHED=y) allows SCHED_FIFO/RR."
		echo 'cgroup_controllers = [ "devices", "memory", "blkio", "cpuset", "cpuacct" ]'
	} >>"$QEMU_CONF"
}

# Whether libvirtd (PID $1) started before the hooks or qemu.conf last
# changed: it reads both only at start. ctime, not mtime: dpkg keeps the
# packaged mtime of the files it installs.
stale() {
	local pidfile=$LIBVIRTD_PIDFILE
	[ -e "$pidfile" ] || return 1
	if [ -n "$(find "$QEMU_CONF" -cnewer "$pidfile" 2>/dev/null)" ]; then
		return 0
	fi
	[ -d "$HOOKS_DIR" ] && [ -n "$(find "$HOOKS_DIR" -cnewer "$pidfile" 2>/dev/null | head -n1)" ]
}

start() {
	[ "$(id -u)" -eq 0 ] || die "run as root"
	[ ! -d /run/systemd/system ] || die "systemd runs here: use systemctl start libvirtd"
	local tool
	for tool in libvirtd virtlogd virsh; do
		command -v "$tool" >/dev/null ||
			die "$tool missing: apt-get install libvirt-daemon-system libvirt-clients"
	done
	configure

	local pid how
	pid=$(running_pid "$VIRTLOGD_PIDFILE" virtlogd)
	how=running
	if [ -z "$pid" ]; then
		pid=$(launch virtlogd "$VIRTLOGD_PIDFILE")
		record virtlogd
		how=started
	fi
	echo "virtlogd $pid $how"

	pid=$(running_pid "$LIBVIRTD_PIDFILE" libvirtd)
	how=running
	if [ -n "$pid" ] && stale; then
		# Running domains survive this: QEMU is not libvirtd's child, and
		# the new libvirtd reconnects to them.
		stop_pid libvirtd "$pid"
		pid=$(launch libvirtd "$LIBVIRTD_PIDFILE")
		# If we started the old one, we own the new one too (already recorded).
		how=restarted
	elif [ -z "$pid" ]; then
		pid=$(launch libvirtd "$LIBVIRTD_PIDFILE")
		record libvirtd
		how=started
	fi
	wait_answering
	echo "libvirtd $pid $how"
}

stop() {
	[ -f "$STATE" ] || return 0
	local pid
	# libvirtd first: it talks to virtlogd.
	if grep -qx libvirtd "$STATE"; then
		pid=$(running_pid "$LIBVIRTD_PIDFILE" libvirtd)
		if [ -n "$pid" ]; then
			stop_pid libvirtd "$pid"
			echo "libvirtd $pid stopped"
		fi
	fi
	if grep -qx virtlogd "$STATE"; then
		pid=$(running_pid "$VIRTLOGD_PIDFILE" virtlogd)
		if [ -n "$pid" ]; then
			stop_pid virtlogd "$pid"
			echo "virtlogd $pid stopped"
		fi
	fi
	rm -f "$STATE"
}

status() {
	echo "virtlogd $(running_pid "$VIRTLOGD_PIDFILE" virtlogd)"
	echo "libvirtd $(running_pid "$LIBVIRTD_PIDFILE" libvirtd)"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
