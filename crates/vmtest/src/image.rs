//! The guest image: a Debian cloud kernel and a busybox initramfs holding the
//! pvsched module, small test programs and chosen host binaries.
//!
//! Images are cached under `<target>/pvsched-vmtest/images/<key>`, the key a
//! hash of everything that goes in (module and program sources, the ABI
//! header, kernel, busybox, binaries and their libraries, the init scripts):
//! a rerun with nothing changed reuses the image in milliseconds.

use std::cmp::Ordering;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cpio::Archive;
use crate::error::{io_err, path_ctx, require, Error, Result};

/// Set (to `1`) in every process of the KVM host VM (`pvsched-hostvm`): its
/// file system is this machine's, read-only.
pub const IN_HOST_VM_ENV: &str = "PVSCHED_HOSTVM";

/// Where the module lands in the guest.
pub const GUEST_MODULE_PATH: &str = "/lib/modules/pvsched.ko";

/// Packages that provide what an image needs (for error messages).
pub const INSTALL_HINT: &str = "install the test dependencies: `make deps` or apt-get install \
     qemu-system-x86 linux-image-cloud-amd64 linux-headers-cloud-amd64 busybox-static rt-tests \
     build-essential";

/// Bumped whenever the image layout changes, so old cache entries are not used.
const IMAGE_FORMAT: &str = "pvsched-vmtest image v2";

const INIT: &str = r#"#!/bin/sh
# pvsched-vmtest guest init: mount, then serve commands on the console.
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t debugfs debugfs /sys/kernel/debug
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# The kernel console is ttyS1 (a file on the host): all messages go there.
# Commands are served on ttyS0.
dmesg -n 8
exec </dev/ttyS0 >/dev/ttyS0 2>&1
stty -echo -onlcr 2>/dev/null
echo "__PVS_READY__ $(nproc) $(uname -r)"
exec /bin/sh /pvs-loop
"#;

/// The command loop a guest's init runs on its console (`sh -c`): one line
/// in, `<id> <timeout-seconds> <command>`; the output framed by markers, the
/// exit status after the end marker, guest uptimes after both. Other harnesses
/// booting a system of their own (the KVM host VM) run it too, after printing
/// [`crate::vm::READY`].
pub const LOOP: &str = r#"while IFS= read -r line; do
	[ -n "$line" ] || continue
	id=${line%% *}
	rest=${line#* }
	secs=${rest%% *}
	cmd=${rest#* }
	read up idle </proc/uptime
	echo "__PVS_BEGIN_${id}__ $up"
	timeout -s KILL "$secs" /bin/sh -c "$cmd" </dev/null 2>&1
	rc=$?
	read up idle </proc/uptime
	printf '\n__PVS_END_%s__ %s %s\n' "$id" "$rc" "$up"
done
echo "__PVS_LOOP_EXIT__"
"#;

/// What goes into a guest image. `Default` gives the image the pvsched tests
/// use: newest cloud kernel, the module, cyclictest, hackbench and chrt.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    /// Kernel image; default: the newest `/boot/vmlinuz-*-cloud-amd64`.
    pub kernel: Option<PathBuf>,
    /// Headers to build the module against; default: the kernel's
    /// `/usr/src/linux-headers-<release>`.
    pub kdir: Option<PathBuf>,
    /// Build guest/pvsched.ko and put it at [`GUEST_MODULE_PATH`].
    pub module: bool,
    /// Host executables copied to `/usr/bin/<name>` with the libraries `ldd`
    /// lists for them.
    pub binaries: Vec<PathBuf>,
    /// Further host files: (host path, absolute guest path).
    pub files: Vec<(PathBuf, String)>,
}

impl Default for ImageConfig {
    fn default() -> Self {
        Self {
            kernel: None,
            kdir: None,
            module: true,
            binaries: default_binaries(),
            files: Vec::new(),
        }
    }
}

/// Host binaries every default image carries.
pub fn default_binaries() -> Vec<PathBuf> {
    ["/usr/bin/cyclictest", "/usr/bin/hackbench", "/usr/bin/chrt"]
        .iter()
        .map(PathBuf::from)
        .collect()
}

/// A built image, ready to boot.
#[derive(Clone, Debug)]
pub struct GuestImage {
    pub kernel: PathBuf,
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    pub initramfs: PathBuf,
    /// The module on the host (also in the image at [`GUEST_MODULE_PATH`]).
    pub module: Option<PathBuf>,
    /// The cache directory of this image.
    pub dir: PathBuf,
}

/// The repository root (two levels above this crate), or `$PVSCHED_ROOT`.
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("PVSCHED_ROOT") {
        return PathBuf::from(root);
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

/// Cache root: `$PVSCHED_VMTEST_CACHE`, else `$CARGO_TARGET_DIR/pvsched-vmtest`,
/// else `<root>/target/pvsched-vmtest`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("PVSCHED_VMTEST_CACHE") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("pvsched-vmtest")
}

/// Compares version strings piecewise, numbers as numbers ("6.10" > "6.9").
fn version_cmp(a: &str, b: &str) -> Ordering {
    fn pieces(s: &str) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let digit = c.is_ascii_digit();
            match out.last_mut() {
                Some((d, p)) if *d == digit => p.push(c),
                _ => out.push((digit, c.to_string())),
            }
        }
        out
    }
    let (pa, pb) = (pieces(a), pieces(b));
    for (x, y) in pa.iter().zip(pb.iter()) {
        let ord = match (x.0, y.0) {
            (true, true) => {
                let (nx, ny) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
                nx.len().cmp(&ny.len()).then_with(|| nx.cmp(ny))
            }
            _ => x.1.cmp(&y.1),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    pa.len().cmp(&pb.len())
}

/// The newest `/boot/vmlinuz-*-cloud-amd64` and its release string.
pub fn find_cloud_kernel() -> Result<(PathBuf, String)> {
    let entries = fs::read_dir("/boot").map_err(io_err("reading /boot"))?;
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("vmlinuz-").map(str::to_string))
        .filter(|r| r.ends_with("-cloud-amd64"))
        .collect();
    found.sort_by(|a, b| version_cmp(a, b));
    let release = found.pop().ok_or_else(|| Error::Missing {
        what: "/boot/vmlinuz-*-cloud-amd64 (Debian cloud kernel)".into(),
        hint: INSTALL_HINT.into(),
    })?;
    Ok((PathBuf::from(format!("/boot/vmlinuz-{release}")), release))
}

fn release_of(kernel: &Path) -> Result<String> {
    kernel
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Other(format!(
                "cannot tell the release of {} (expected vmlinuz-<release>)",
                kernel.display()
            ))
        })
}

/// Finds `name` in `$PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.exists().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// 64-bit FNV-1a: a stable content hash for cache keys.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, data: &[u8]) {
        for b in data {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Length-delimit fields so that ("ab","c") != ("a","bc").
        for b in (data.len() as u64).to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    /// A file by identity (path, size, mtime): for large host files.
    fn stamp(&mut self, path: &Path) -> Result<()> {
        let meta = fs::metadata(path).map_err(io_err(path_ctx("stat", path)))?;
        self.str(&path.display().to_string());
        self.bytes(&meta.len().to_le_bytes());
        self.bytes(&meta.mtime().to_le_bytes());
        self.bytes(&meta.mtime_nsec().to_le_bytes());
        Ok(())
    }
    /// A file by content: for sources.
    fn content(&mut self, path: &Path) -> Result<()> {
        let data = fs::read(path).map_err(io_err(path_ctx("reading", path)))?;
        self.str(&path.display().to_string());
        self.bytes(&data);
        Ok(())
    }
}

/// Source files of a directory tree (sorted), skipping build output.
fn source_files(dir: &Path, exts: &[&str], names: &[&str]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(io_err(path_ctx("reading", &d)))? {
            let entry = entry.map_err(io_err(path_ctx("reading", &d)))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "build" && !name.starts_with('.') {
                    stack.push(path);
                }
                continue;
            }
            let ext_ok = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| exts.contains(&e));
            let is_generated = name.ends_with(".mod.c");
            if (ext_ok && !is_generated) || names.contains(&name.as_str()) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Libraries `ldd` lists for `bin` (none for a static binary).
fn ldd(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(io_err("running ldd"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        // "not a dynamic executable": nothing to copy.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        if line.contains("not found") {
            return Err(Error::Missing {
                what: format!("a library of {}: {}", bin.display(), line.trim()),
                hint: "install the package that provides it".into(),
            });
        }
        let candidate = match line.split_once("=>") {
            Some((_, rhs)) => rhs.trim(),
            None => line.trim(),
        };
        let path = candidate.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(io_err(format!("running {what}")))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(Error::Command {
            command: what.to_string(),
            status: out.status.to_string(),
            output: text,
        });
    }
    Ok(text)
}

/// Everything an image is made of, resolved on the host.
struct Inputs {
    root: PathBuf,
    kernel: PathBuf,
    release: String,
    kdir: Option<PathBuf>,
    busybox: PathBuf,
    cc: PathBuf,
    progs: Vec<PathBuf>,
    /// Headers the programs include (`spin.h`): part of the cache key.
    prog_headers: Vec<PathBuf>,
    binaries: Vec<(PathBuf, Vec<PathBuf>)>,
    files: Vec<(PathBuf, String)>,
}

impl Inputs {
    fn resolve(cfg: &ImageConfig) -> Result<Self> {
        let root = workspace_root();
        let (kernel, release) = match &cfg.kernel {
            Some(k) => (require(k.clone(), INSTALL_HINT)?, release_of(k)?),
            None => find_cloud_kernel()?,
        };
        let kdir = if cfg.module {
            let kdir = cfg
                .kdir
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("/usr/src/linux-headers-{release}")));
            Some(require(kdir, INSTALL_HINT)?)
        } else {
            None
        };
        let busybox = require(PathBuf::from("/bin/busybox"), INSTALL_HINT)?;
        let cc = which("cc").ok_or_else(|| Error::Missing {
            what: "cc (C compiler for the guest test programs)".into(),
            hint: INSTALL_HINT.into(),
        })?;
        let progs_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-progs");
        let progs = source_files(&progs_dir, &["c"], &[])?;
        let prog_headers = source_files(&progs_dir, &["h"], &[])?;
        let mut binaries = Vec::new();
        for bin in &cfg.binaries {
            let bin = require(bin.clone(), INSTALL_HINT)?;
            let libs = ldd(&bin)?;
            binaries.push((bin, libs));
        }
        let mut files = Vec::new();
        for (host, guest) in &cfg.files {
            files.push((
                require(host.clone(), "a file the image config names")?,
                guest.clone(),
            ));
        }
        Ok(Self {
            root,
            kernel,
            release,
            kdir,
            busybox,
            cc,
            progs,
            prog_headers,
            binaries,
            files,
        })
    }

    fn key(&self) -> Result<String> {
        let mut h = Fnv::new();
        h.str(IMAGE_FORMAT);
        h.str(INIT);
        h.str(LOOP);
        h.stamp(&self.kernel)?;
        h.str(&self.release);
        if let Some(kdir) = &self.kdir {
            h.str(&kdir.display().to_string());
            let symvers = kdir.join("Module.symvers");
            if symvers.exists() {
                h.stamp(&symvers)?;
            }
            for src in source_files(
                &self.root.join("guest"),
                &["c", "h"],
                &["Kbuild", "Makefile", "dkms.conf"],
            )? {
                h.content(&src)?;
            }
            h.content(&self.root.join("abi/pvsched_abi.h"))?;
        }
        h.stamp(&self.busybox)?;
        h.stamp(&self.cc)?;
        for p in self.progs.iter().chain(&self.prog_headers) {
            h.content(p)?;
        }
        h.content(&self.root.join("guest/uapi/pvsched.h"))?;
        for (bin, libs) in &self.binaries {
            h.stamp(bin)?;
            for lib in libs {
                h.stamp(lib)?;
            }
        }
        for (host, guest) in &self.files {
            h.stamp(host)?;
            h.str(guest);
        }
        Ok(format!("{:016x}", h.0))
    }
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Cached images kept; the least recently used beyond that are removed.
const KEEP_IMAGES: usize = 8;

/// Removes all but the `keep` most recently used image directories (and
/// leftovers of interrupted builds older than an hour).
fn prune(images: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(images) else {
        return;
    };
    let now = SystemTime::now();
    let mut dirs: Vec<(SystemTime, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".tmp-") {
            let old = now
                .duration_since(modified)
                .is_ok_and(|age| age.as_secs() > 3600);
            if old {
                let _ = fs::remove_dir_all(&path);
            }
            continue;
        }
        dirs.push((modified, path));
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    for (_, path) in dirs.into_iter().skip(keep) {
        let _ = fs::remove_dir_all(&path);
    }
}

impl GuestImage {
    /// The default image (see [`ImageConfig::default`]).
    pub fn build_default() -> Result<Self> {
        Self::build(&ImageConfig::default())
    }

    /// Builds the image, or reuses the cached one with the same inputs.
    pub fn build(cfg: &ImageConfig) -> Result<Self> {
        let inputs = Inputs::resolve(cfg)?;
        let key = inputs.key()?;
        let images = cache_root().join("images");
        let dir = images.join(&key);
        // One builder per process at a time; across processes the rename
        // below makes the first finished build win.
        let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !dir.join("initramfs.cpio").exists() {
            if std::env::var_os(IN_HOST_VM_ENV).is_some() {
                // The host VM sees this cache read-only: its builder runs outside.
                return Err(Error::Missing {
                    what: format!("guest image {key} in {}", images.display()),
                    hint: "inside the KVM host VM images are only read: build this image \
                           outside it, before the host VM boots"
                        .into(),
                });
            }
            fs::create_dir_all(&images).map_err(io_err(path_ctx("creating", &images)))?;
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let tmp = images.join(format!("{key}.tmp-{}-{nanos}", std::process::id()));
            fs::create_dir_all(&tmp).map_err(io_err(path_ctx("creating", &tmp)))?;
            let built = build_into(&inputs, &tmp);
            if let Err(e) = built {
                let _ = fs::remove_dir_all(&tmp);
                return Err(e);
            }
            if fs::rename(&tmp, &dir).is_err() {
                // Another process finished first: use its image.
                let _ = fs::remove_dir_all(&tmp);
            }
        }
        // Mark it used, and keep the cache from growing without bound.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.set_modified(SystemTime::now());
        }
        prune(&images, KEEP_IMAGES);
        let module = inputs.kdir.as_ref().map(|_| dir.join("pvsched.ko"));
        Ok(Self {
            kernel: inputs.kernel,
            kernel_release: inputs.release,
            initramfs: dir.join("initramfs.cpio"),
            module,
            dir,
        })
    }
}

/// Builds pvsched.ko from a DKMS tree assembled by `make -C guest dkms-tree`.
/// Returns the module path and the build output.
pub fn build_module(root: &Path, kdir: &Path, out_dir: &Path) -> Result<(PathBuf, String)> {
    let tree = out_dir.join("module-src");
    run(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(root.join("guest"))
            .arg("dkms-tree")
            .arg(format!("DKMS_TREE={}", tree.display())),
        "make -C guest dkms-tree",
    )?;
    let log = run(
        Command::new("make")
            .arg("-C")
            .arg(&tree)
            .arg(format!("KDIR={}", kdir.display()))
            .arg("W=1"),
        "make (pvsched.ko, W=1)",
    )?;
    let ko = require(
        tree.join("pvsched.ko"),
        "the module build produced no pvsched.ko",
    )?;
    Ok((ko, log))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(io_err(path_ctx("reading", path)))
}

fn build_into(inputs: &Inputs, dir: &Path) -> Result<()> {
    let mut a = Archive::new();
    for d in [
        "/bin",
        "/sbin",
        "/usr/bin",
        "/usr/sbin",
        "/proc",
        "/sys",
        "/dev",
        "/tmp",
        "/run",
        "/root",
        "/etc",
        "/lib/modules",
    ] {
        a.dir(d);
    }
    a.file("/init", INIT.as_bytes().to_vec(), 0o755);
    a.file("/pvs-loop", LOOP.as_bytes().to_vec(), 0o644);
    a.file(
        "/etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\n".to_vec(),
        0o644,
    );
    a.file("/etc/group", b"root:x:0:\n".to_vec(), 0o644);

    // Test programs first, so that nothing else shadows them.
    let uapi = inputs.root.join("guest/uapi");
    for src in &inputs.progs {
        let name = src
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| Error::Other(format!("bad program name {}", src.display())))?;
        let out = dir.join(name);
        run(
            Command::new(&inputs.cc)
                .args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
                .arg(&uapi)
                .arg("-o")
                .arg(&out)
                .arg(src),
            &format!("cc {}", src.display()),
        )?;
        a.file(&format!("/usr/bin/{name}"), read(&out)?, 0o755);
    }

    if let Some(kdir) = &inputs.kdir {
        let (ko, log) = build_module(&inputs.root, kdir, dir)?;
        fs::write(dir.join("module-build.log"), &log)
            .map_err(io_err("writing module-build.log"))?;
        let data = read(&ko)?;
        fs::write(dir.join("pvsched.ko"), &data).map_err(io_err("copying pvsched.ko"))?;
        a.file(GUEST_MODULE_PATH, data, 0o644);
    }

    for (bin, libs) in &inputs.binaries {
        let name = bin
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Other(format!("bad binary name {}", bin.display())))?;
        a.file(&format!("/usr/bin/{name}"), read(bin)?, 0o755);
        for lib in libs {
            let guest = lib.display().to_string();
            if !a.contains(&guest) {
                a.file(&guest, read(lib)?, 0o755);
            }
        }
    }
    for (host, guest) in &inputs.files {
        let mode = fs::metadata(host)
            .map_err(io_err(path_ctx("stat", host)))?
            .mode();
        a.file(guest, read(host)?, mode & 0o7777);
    }

    a.file("/bin/busybox", read(&inputs.busybox)?, 0o755);
    let list = run(
        Command::new(&inputs.busybox).arg("--list-full"),
        "busybox --list-full",
    )?;
    for applet in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // `busybox --list` names busybox itself: that one is the binary.
        if applet.rsplit('/').next() == Some("busybox") {
            continue;
        }
        a.symlink(&format!("/{applet}"), "/bin/busybox");
    }

    let path = dir.join("initramfs.cpio");
    fs::write(&path, a.to_bytes()).map_err(io_err(path_ctx("writing", &path)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_numerically() {
        assert_eq!(
            version_cmp("6.10.0-1-cloud-amd64", "6.9.0-9-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.1.0-56-cloud-amd64", "6.1.0-9-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(version_cmp("6.1.0", "6.1.0"), Ordering::Equal);
    }

    #[test]
    fn fnv_is_stable_and_delimited() {
        let mut a = Fnv::new();
        a.str("ab");
        a.str("c");
        let mut b = Fnv::new();
        b.str("a");
        b.str("bc");
        assert_ne!(a.0, b.0);
        let mut c = Fnv::new();
        c.str("ab");
        c.str("c");
        assert_eq!(a.0, c.0);
    }
}
