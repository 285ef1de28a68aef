//! The host VM's initramfs: static busybox, the KVM modules of the host
//! kernel, and an init that mounts this machine's root file system (virtiofs,
//! read-only), loads KVM, makes the writable places a running system needs,
//! and serves commands in a chroot there with the vmtest command loop.
//!
//! Cached under `<work>/initramfs/<key>.cpio`, the key a hash of the init,
//! the loop, busybox and the modules: a rebuild takes a second.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use pvsched_vmtest::cpio::Archive;
use pvsched_vmtest::{HOST_VM_GUEST_CPUS_ENV, IN_HOST_VM_ENV, LOOP, READY};

use crate::error::{io_err, Error, Result};
use crate::packages::HostKernel;

/// The modules KVM needs, in load order (kvm needs irqbypass).
pub const KVM_MODULES: [(&str, &str); 3] = [
    ("irqbypass", "virt/lib/irqbypass.ko.xz"),
    ("kvm", "arch/x86/kvm/kvm.ko.xz"),
    ("kvm-amd", "arch/x86/kvm/kvm-amd.ko.xz"),
];

/// Tracepoints pvschedd and the bench attach to, enabled at boot in two
/// tracefs instances with tracing off (see the init script).
pub const KEPT_TRACEPOINTS: [&str; 13] = [
    "sched/sched_switch",
    "sched/sched_waking",
    "irq/irq_handler_entry",
    "irq/irq_handler_exit",
    "irq/softirq_entry",
    "irq/softirq_exit",
    "timer/hrtimer_expire_entry",
    "timer/hrtimer_expire_exit",
    "kvm/kvm_exit",
    "kvm/kvm_vcpu_wakeup",
    "kvm/kvm_apic_accept_irq",
    "ipi/ipi_send_cpu",
    "ipi/ipi_send_cpumask",
];

/// Places of the root file system that must be writable, each a tmpfs.
pub const TMPFS: [&str; 8] = [
    "/tmp",
    "/run",
    "/var/tmp",
    "/var/log",
    "/var/lib/libvirt",
    "/var/cache/libvirt",
    "/root",
    "/dev/shm",
];

/// The init script (busybox sh). `@...@` are filled in by [`init_script`].
const INIT: &str = r#"#!/bin/busybox sh
# pvsched-hostvm init: this machine's userland, read-only, on the host VM's kernel.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel console is ttyS1 (a file on the host): every message goes there.
dmesg -n 8
fail() {
	echo "__PVS_HOSTVM_FAILED__ $*" >/dev/ttyS0
	echo "pvsched-hostvm init: $*" >/dev/kmsg
	poweroff -f
}
# Module parameters: pvs_hostvm.<module>=a=1,b=2 on the kernel command line.
for m in @MODULES@; do
	p=$(sed -n "s/.*pvs_hostvm\.$m=\([^ ]*\).*/\1/p" /proc/cmdline | tr , ' ')
	insmod /modules/$m.ko $p || fail "insmod $m $p"
done
[ -c /dev/kvm ] || fail "no /dev/kvm after loading kvm"
R=/newroot
mkdir -p $R
mount -t virtiofs -o ro root $R || fail "mounting the root share (virtiofs tag root)"
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
for d in @TMPFS@; do
	[ -d $R$d ] && mount -t tmpfs -o mode=0755 tmpfs $R$d
done
chmod 1777 $R/tmp $R/var/tmp $R/dev/shm
mount -t debugfs debugfs $R/sys/kernel/debug
mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t bpf bpf $R/sys/fs/bpf
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
# The exchange folder, read-write, at the same path as on the machine.
x=$(sed -n 's/.*pvs_hostvm.xchg=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$x" ]; then
	# Under a tmpfs (/tmp) the folder is not there yet.
	mkdir -p $R$x 2>/dev/null
	mount -t virtiofs xchg $R$x || fail "mounting the exchange share at $x"
fi
# Multi-threaded TCG mishandles live kernel text patching now and then (a
# CPU runs a stale translation of a patched site: "Oops: int3", hangs).
# Enabling a tracepoint patches its static key, and its second probe its
# static call; with two probes in place from boot (tracing off), pvschedd's
# programs and the bench's tracing attach as a third and patch nothing.
T=$R/sys/kernel/tracing
mkdir -p $T/instances/pvs-hostvm
for e in @TRACEPOINTS@; do
	echo 1 >$T/events/$e/enable || fail "enabling tracepoint $e"
	echo 1 >$T/instances/pvs-hostvm/events/$e/enable || fail "enabling tracepoint $e (instance)"
done
echo 0 >$T/tracing_on
echo 0 >$T/instances/pvs-hostvm/tracing_on
# The CPUs KVM guests are confined to (pvsched-vmtest reads it), if any.
g=$(sed -n 's/.*pvs_hostvm.guest_cpus=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$g" ] && export @GUEST_CPUS_ENV@=$g
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root @ENV@=1
exec </dev/ttyS0 >/dev/ttyS0 2>&1
stty -echo -onlcr 2>/dev/null
echo "@READY@ $(nproc) $(uname -r)"
exec chroot $R /bin/sh -c "$(cat /pvs-loop)"
"#;

fn init_script() -> String {
    let modules: Vec<&str> = KVM_MODULES.iter().map(|(name, _)| *name).collect();
    INIT.replace("@MODULES@", &modules.join(" "))
        .replace("@TMPFS@", &TMPFS.join(" "))
        .replace("@TRACEPOINTS@", &KEPT_TRACEPOINTS.join(" "))
        .replace("@ENV@", IN_HOST_VM_ENV)
        .replace("@GUEST_CPUS_ENV@", HOST_VM_GUEST_CPUS_ENV)
        .replace("@READY@", READY)
}

/// Printed on the command console by an init that cannot go on.
pub const INIT_FAILED: &str = "__PVS_HOSTVM_FAILED__";

const BUSYBOX: &str = "/bin/busybox";

/// 64-bit FNV-1a over the parts of an initramfs.
struct Key(u64);

impl Key {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, data: &[u8]) {
        for b in data.iter().chain(&(data.len() as u64).to_le_bytes()) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn file(&mut self, path: &Path) -> Result<()> {
        let meta = fs::metadata(path).map_err(io_err(format!("stat {}", path.display())))?;
        self.bytes(path.display().to_string().as_bytes());
        self.bytes(&meta.len().to_le_bytes());
        self.bytes(&meta.mtime().to_le_bytes());
        Ok(())
    }
}

fn unxz(path: &Path) -> Result<Vec<u8>> {
    let out = Command::new("xz")
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(io_err("running xz (package xz-utils)"))?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "xz -dc {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(out.stdout)
}

/// The initramfs for `kernel`, built or taken from the cache in `work`.
pub fn build(kernel: &HostKernel, work: &Path) -> Result<PathBuf> {
    let busybox = Path::new(BUSYBOX);
    if !busybox.is_file() {
        return Err(Error::Missing {
            what: BUSYBOX.into(),
            hint: "install busybox-static (`make deps`)".into(),
        });
    }
    let init = init_script();
    let mut key = Key::new();
    key.bytes(init.as_bytes());
    key.bytes(LOOP.as_bytes());
    key.file(busybox)?;
    let mut modules = Vec::new();
    for (name, rel) in KVM_MODULES {
        let path = kernel.module(rel)?;
        key.file(&path)?;
        modules.push((name, path));
    }
    let dir = work.join("initramfs");
    let out = dir.join(format!("{:016x}.cpio", key.0));
    if out.is_file() {
        return Ok(out);
    }
    let mut a = Archive::new();
    for d in ["/bin", "/proc", "/sys", "/dev", "/modules", "/newroot"] {
        a.dir(d);
    }
    a.file("/init", init.into_bytes(), 0o755);
    a.file("/pvs-loop", LOOP.as_bytes().to_vec(), 0o644);
    let bb = fs::read(busybox).map_err(io_err(format!("reading {BUSYBOX}")))?;
    a.file("/bin/busybox", bb, 0o755);
    for (name, path) in modules {
        a.file(&format!("/modules/{name}.ko"), unxz(&path)?, 0o644);
    }
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(".{:016x}.{}", key.0, std::process::id()));
    fs::write(&tmp, a.to_bytes()).map_err(io_err(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, &out).map_err(io_err(format!("renaming {}", tmp.display())))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_has_every_placeholder_filled() {
        let init = init_script();

        assert!(!init.contains('@'), "{init}");
        assert!(init.contains("insmod /modules/$m.ko"));
        assert!(init.contains("for m in irqbypass kvm kvm-amd; do"));
        assert!(init.contains(&format!("export HOME=/root {IN_HOST_VM_ENV}=1")));
    }
}
