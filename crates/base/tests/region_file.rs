//! Region files as an attack surface: the file belongs to the VMM's user,
//! who can give it any type, size or link count, or truncate it while it
//! is mapped. Real files in /dev/shm (tmpfs, where region files live), real
//! truncation through another descriptor.
//!
//! A truncation test must show the old behaviour (death by SIGBUS) as a
//! failure rather than killing the whole test binary, so it runs its body in
//! a child: this binary again, with only that test and [`CHILD`] set.

use std::fs::OpenOptions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};

use pvsched_abi::*;
use pvsched_base::region_file::*;

const GIB: u64 = 1 << 30;

/// Set in a child process to the name of the test it runs.
const CHILD: &str = "PVSCHED_REGION_FILE_CHILD";
/// The directory the parent made for the child (and removes, however the
/// child ends).
const CHILD_DIR: &str = "PVSCHED_REGION_FILE_DIR";

/// True in the child that runs `test`'s body.
fn in_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

/// The child's directory, made by its parent.
fn child_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(CHILD_DIR).unwrap())
}

/// Runs test `test` of this binary in a child process working in `dir`
/// (without core dumps: some children are meant to die) and returns how it
/// ended.
fn run_in_child(test: &str, dir: &ShmDir) -> ExitStatus {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .env(CHILD_DIR, &dir.0)
        // The child's harness lines would read as this binary's; its
        // panics go to stderr.
        .stdout(std::process::Stdio::null());
    // SAFETY: setrlimit between fork and exec: async-signal-safe, no allocation.
    unsafe {
        cmd.pre_exec(|| {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &zero) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.status().unwrap()
}

/// A fresh directory in /dev/shm, removed on drop.
struct ShmDir(PathBuf);

impl ShmDir {
    fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from(format!(
            "/dev/shm/pvsched-base-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn file_of_len(path: &Path, len: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
}

fn truncate(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_region_file_of_another_size_than_the_vcpus_need_is_refused_untouched() {
    let dir = ShmDir::new("size");
    // Two slots need one page; a power of two above it, up to 64 MiB, is
    // taken too (libvirt's sizes), anything else is not.
    for len in [0, 1, 4095, 12288, (1 << 20) + 4096, 128 << 20] {
        let path = dir.join(&format!("len{len}"));
        file_of_len(&path, len);

        let opened = RegionFile::open(&path, 2);
        let created = RegionFile::create(&path, 2, 0o600);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let handed = RegionFile::from_file(&path, file, 2);

        for r in [opened, created, handed] {
            assert!(
                matches!(r, Err(RegionFileError::WrongSize { len: l, want: 4096, .. }) if l == len),
                "{len} bytes: {r:?}"
            );
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    }
}

#[test]
fn a_region_file_sized_in_mib_as_libvirt_makes_it_is_mapped_at_bar_size_only() {
    let dir = ShmDir::new("mib");
    let path = dir.join("region");
    file_of_len(&path, 1 << 20);

    let file = RegionFile::open(&path, 2).unwrap();

    assert_eq!(file.len() as u64, pvsched_abi::bar_size(2));
    assert!(file.check_intact().is_ok());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    truncate(&path, pvsched_abi::bar_size(2));
    assert!(
        matches!(
            file.check_intact(),
            Err(RegionFileError::WrongSize { want, .. }) if want == 1 << 20
        ),
        "a shrink to the mapped size is still a change: {:?}",
        file.check_intact()
    );
}

#[test]
fn a_huge_sparse_region_file_is_refused_without_being_mapped_or_zeroed() {
    let dir = ShmDir::new("sparse");
    let path = dir.join("huge");
    file_of_len(&path, 64 * GIB);

    let opened = RegionFile::open(&path, 2);
    let created = RegionFile::create(&path, 2, 0o600);

    for r in [opened, created] {
        assert!(
            matches!(r, Err(RegionFileError::WrongSize { len, .. }) if len == 64 * GIB),
            "{r:?}"
        );
    }
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 64 * GIB);
    assert_eq!(meta.blocks(), 0, "the sparse file got pages");
}

#[test]
fn a_region_file_with_another_name_is_refused() {
    let dir = ShmDir::new("links");
    let path = dir.join("region");
    file_of_len(&path, 4096);
    std::fs::hard_link(&path, dir.join("elsewhere")).unwrap();

    let r = RegionFile::open(&path, 2);

    assert!(
        matches!(r, Err(RegionFileError::HardLinks { links: 2, .. })),
        "{r:?}"
    );
}

#[test]
fn a_region_path_that_is_not_a_regular_file_is_refused() {
    let dir = ShmDir::new("type");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let subdir = dir.join("dir");
    std::fs::create_dir(&subdir).unwrap();

    // A FIFO must not block the open either: the test would hang.
    let fifo_r = RegionFile::open(&fifo, 2);
    let dir_r = RegionFile::open(&subdir, 2);

    assert!(
        matches!(fifo_r, Err(RegionFileError::NotRegular { .. })),
        "{fifo_r:?}"
    );
    assert!(
        matches!(
            dir_r,
            Err(RegionFileError::NotRegular { .. } | RegionFileError::Io { op: "open", .. })
        ),
        "{dir_r:?}"
    );
}

#[test]
fn creating_a_region_for_more_vcpus_than_the_abi_allows_creates_no_file() {
    let dir = ShmDir::new("slots");
    let path = dir.join("region");

    let too_many = RegionFile::create(&path, MAX_SLOTS + 904, 0o600);
    let none = RegionFile::create(&path, 0, 0o600);

    for (r, n) in [(too_many, MAX_SLOTS + 904), (none, 0)] {
        assert!(
            matches!(r, Err(RegionFileError::BadSlotCount { slot_count, max: MAX_SLOTS, .. }) if slot_count == n),
            "{n}: {r:?}"
        );
    }
    assert!(!path.exists(), "a file was created before refusing");
}

#[test]
fn a_created_region_is_mapped_at_exactly_its_bar_size() {
    let dir = ShmDir::new("exact");
    let path = dir.join("region");

    let file = RegionFile::create(&path, 20, 0o600).unwrap();

    assert_eq!(file.len() as u64, bar_size(20));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), bar_size(20));
    assert!(file.check_intact().is_ok());
    assert!(!file.truncated());
}

#[test]
fn a_region_truncated_under_its_mapping_reads_zeros_and_reports_truncated() {
    const TEST: &str = "a_region_truncated_under_its_mapping_reads_zeros_and_reports_truncated";
    if !in_child(TEST) {
        let dir = ShmDir::new("truncated");
        let status = run_in_child(TEST, &dir);
        assert!(
            status.success(),
            "the child {}",
            match status.signal() {
                Some(libc::SIGBUS) => "died of SIGBUS".to_string(),
                _ => format!("failed: {status}"),
            }
        );
        return;
    }
    let path = child_dir().join("region");
    let mut file = RegionFile::create(&path, 2, 0o600).unwrap();
    file.region_mut().init_header(2, F_ALL).unwrap();
    let fifo = GuestHalf {
        flags: GF_ACTIVE,
        policy: POLICY_FIFO,
        rt_priority: 10,
        ..GuestHalf::default()
    };
    file.region().write_guest(1, &fifo).unwrap();
    let before = file.region().read_guest(1).unwrap();
    assert_eq!((before.policy, before.rt_priority), (POLICY_FIFO, 10));

    // The owner truncates the file through a descriptor of its own.
    truncate(&path, 0);
    let guest = file.region().read_guest(1);
    let header = file.region().header();
    file.region().write_host(0, &HostHalf::default()).unwrap();

    assert_eq!(guest, Ok(GuestHalf::default()));
    assert_eq!(header.magic, 0);
    assert!(file.truncated());
    assert!(
        matches!(file.check_intact(), Err(RegionFileError::Truncated { .. })),
        "{:?}",
        file.check_intact()
    );
}

#[test]
fn a_truncation_no_access_has_hit_yet_is_seen_by_the_size_check() {
    let dir = ShmDir::new("shrunk");
    let path = dir.join("region");
    let file = RegionFile::create(&path, 20, 0o600).unwrap();

    truncate(&path, 4096);

    assert!(!file.truncated());
    assert!(
        matches!(
            file.check_intact(),
            Err(RegionFileError::WrongSize {
                len: 4096,
                want: 8192,
                ..
            })
        ),
        "{:?}",
        file.check_intact()
    );
}

#[test]
fn a_sigbus_outside_every_region_still_kills_the_process() {
    const TEST: &str = "a_sigbus_outside_every_region_still_kills_the_process";
    if !in_child(TEST) {
        let dir = ShmDir::new("foreign");
        let status = run_in_child(TEST, &dir);
        assert_eq!(status.signal(), Some(libc::SIGBUS), "the child {status}");
        return;
    }
    let dir = child_dir();
    let _region = RegionFile::create(&dir.join("region"), 2, 0o600).unwrap();
    let other = dir.join("other");
    file_of_len(&other, 4096);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&other)
        .unwrap();
    let map = memmap2::MmapOptions::new().len(4096).map_raw(&f).unwrap();

    f.set_len(0).unwrap();
    // SAFETY: a read of a live mapping; the truncation makes it fault.
    let byte = unsafe { std::ptr::read_volatile(map.as_ptr()) };

    panic!("read {byte} from a truncated mapping without SIGBUS");
}

#[test]
fn region_file_is_created_private_and_sized_for_the_slots() {
    let dir = ShmDir::new("private");
    let path = dir.join("vm0");

    let mut file = RegionFile::create(&path, 20, 0o600).unwrap();
    file.region_mut().init_header(20, F_ALL).unwrap();

    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 8192);
    let reopened = RegionFile::open(&path, 20).unwrap();
    assert_eq!(reopened.region().validate().unwrap().header.slot_count, 20);
}

#[test]
fn a_world_writable_region_file_is_refused() {
    let dir = ShmDir::new("world-writable");
    let path = dir.join("vm0");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();

    let err = RegionFile::open(&path, 1).unwrap_err();

    assert!(
        matches!(err, RegionFileError::WorldWritable { mode: 0o666, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("world-writable"));
}

#[test]
fn a_symlinked_region_file_is_refused() {
    let dir = ShmDir::new("symlink");
    std::fs::write(dir.join("real"), vec![0u8; 4096]).unwrap();
    std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();

    assert!(RegionFile::open(&dir.join("link"), 1).is_err());
}
