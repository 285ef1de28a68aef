//! pvsched-fake-vmm: a stand-in VMM process for tests of pvschedd that need
//! no guest: threads named like vCPU threads, a region file mapped like
//! QEMU's ivshmem memory backend, guest halves written as the guest module
//! would, and optionally a QMP socket that answers `query-cpus-fast` (with
//! the truth, or with the thread ids a test wants it to lie about).
//!
//! ```text
//! pvsched-fake-vmm --region PATH [--vcpus N] [--name-format "CPU {}/TCG"]
//!                  [--guest-fifo PRIO] [--guest-cs FLAGS [--guest-cs-duty HOLD_US/PERIOD_US]]
//!                  [--guest-pending PRIO]
//!                  [--guest-rt-bursts] [--guest-lock-wait W=H] [--spin]
//!                  [--spin-first N]
//!                  [--no-map] [--qmp PATH]
//!                  [--qmp-tids TID,TID,...] [--seconds S]
//! pvsched-fake-vmm --ivshmem-server SOCKET [-name NAME] [--ring-every-ms MS]
//!                  [--ivshmem-garbage] [--ivshmem-no-read] [other options]
//! ```
//!
//! With `--ivshmem-server` it connects to that socket as QEMU's
//! `ivshmem-doorbell` does, takes its region and the host's doorbell from
//! the handshake, and rings the doorbell every `--ring-every-ms`;
//! `--ivshmem-garbage` then writes to the socket (QEMU never does),
//! `--ivshmem-no-read` connects and never reads. `-name` is QEMU's
//! spelling, read by the server from the command line. A handshake that
//! fails prints `ivshmem-refused WHY` instead of `ready` and exits 3.
//!
//! `--guest-cs-duty HOLD_US/PERIOD_US` (with `--spin`): the guest half
//! claims `--guest-cs` only for the first HOLD_US of every PERIOD_US it
//! spins, as a guest that takes a lock for most of each operation and leaves
//! it between two; the flags are written when they change.
//!
//! `--guest-lock-wait W=H`: vCPU W's guest half publishes a wait for a mutex
//! whose holder runs on vCPU H, all the time (as the guest module does for a
//! contended mutex, `lock_holder` = H + 1).
//!
//! Prints `ready PID TID0 TID1 ...` on stdout once its threads run (and its
//! QMP socket listens), then runs until killed or `--seconds` pass. It maps
//! the region in the background as soon as the file exists, and uses it once
//! the file holds a valid header (the daemon initialises it). `--no-map` only carries the
//! region path in its command line (`mem-path=PATH`), as a wrapper would.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pvsched_abi::{
    GuestHalf, GF_ACTIVE, GF_IDLE, LOCK_F_MUTEX, PENDING_POLICY_SHIFT, PENDING_VALID, POLICY_FIFO,
};
use pvsched_base::ivshmem;
use pvsched_base::region_file::RegionFile;
use pvsched_base::thread::gettid;

struct Args {
    region: PathBuf,
    vcpus: u32,
    name_format: String,
    guest_fifo: Option<u32>,
    /// The guest half claims these PVSCHED_CS_* flags all the time.
    guest_cs: Option<u32>,
    /// (hold, period) µs: `guest_cs` only for the first `hold` of each `period`.
    guest_cs_duty: Option<(u64, u64)>,
    /// The guest half always holds a pending hint: a FIFO task of this priority woken
    /// onto the vCPU (by another vCPU) and not running yet.
    guest_pending: Option<u32>,
    /// The guest half always shows an idle guest whose RT switch count moves each
    /// period: RT work that runs between the host's reads, as under KVM.
    guest_rt_bursts: bool,
    /// (waiter, holder): the waiter vCPU's guest half names the holder's vCPU.
    guest_lock_wait: Option<(u32, u32)>,
    spin: bool,
    /// `--spin-first N`: only vCPUs below N spin, the others sleep.
    spin_first: Option<u32>,
    no_map: bool,
    qmp: Option<PathBuf>,
    qmp_tids: Option<Vec<i64>>,
    seconds: Option<f64>,
    ivshmem_server: Option<PathBuf>,
    ring_every_ms: Option<u64>,
    ivshmem_garbage: bool,
    ivshmem_no_read: bool,
}

fn usage(msg: &str) -> ! {
    eprintln!("pvsched-fake-vmm: {msg}");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        region: PathBuf::new(),
        vcpus: 2,
        name_format: "CPU {}/TCG".into(),
        guest_fifo: None,
        guest_cs: None,
        guest_cs_duty: None,
        guest_pending: None,
        guest_rt_bursts: false,
        guest_lock_wait: None,
        spin: false,
        spin_first: None,
        no_map: false,
        qmp: None,
        qmp_tids: None,
        seconds: None,
        ivshmem_server: None,
        ring_every_ms: None,
        ivshmem_garbage: false,
        ivshmem_no_read: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            // Also accepted in QEMU's spelling, so that command-line scans see it.
            s if s.starts_with("mem-path=") => a.region = PathBuf::from(&s["mem-path=".len()..]),
            "--region" => a.region = PathBuf::from(value()),
            "--vcpus" => a.vcpus = value().parse().unwrap_or_else(|_| usage("--vcpus N")),
            "--name-format" => a.name_format = value(),
            "--guest-cs" => {
                a.guest_cs = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--guest-cs FLAGS")),
                )
            }
            "--guest-cs-duty" => {
                let v = value();
                a.guest_cs_duty = v
                    .split_once('/')
                    .and_then(|(h, p)| Some((h.parse().ok()?, p.parse().ok()?)))
                    .filter(|&(h, p): &(u64, u64)| h < p);
                if a.guest_cs_duty.is_none() {
                    usage("--guest-cs-duty HOLD_US/PERIOD_US (HOLD_US < PERIOD_US)");
                }
            }
            "--guest-fifo" => {
                a.guest_fifo = Some(value().parse().unwrap_or_else(|_| usage("--guest-fifo P")))
            }
            "--guest-pending" => {
                a.guest_pending = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--guest-pending PRIO")),
                )
            }
            "--guest-rt-bursts" => a.guest_rt_bursts = true,
            "--guest-lock-wait" => {
                let v = value();
                a.guest_lock_wait = v
                    .split_once('=')
                    .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
                    .filter(|(w, h)| w != h);
                if a.guest_lock_wait.is_none() {
                    usage("--guest-lock-wait WAITER=HOLDER (two different vCPU indexes)");
                }
            }
            "--spin" => a.spin = true,
            "--spin-first" => {
                a.spin = true;
                a.spin_first = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--spin-first N (a vCPU count)")),
                );
            }
            "--no-map" => a.no_map = true,
            "--qmp" => a.qmp = Some(PathBuf::from(value())),
            "--qmp-tids" => {
                a.qmp_tids = Some(
                    value()
                        .split(',')
                        .map(|t| t.parse().unwrap_or_else(|_| usage("--qmp-tids T,T")))
                        .collect(),
                )
            }
            "--seconds" => {
                a.seconds = Some(value().parse().unwrap_or_else(|_| usage("--seconds S")))
            }
            "--ivshmem-server" => a.ivshmem_server = Some(PathBuf::from(value())),
            "--ring-every-ms" => {
                a.ring_every_ms = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--ring-every-ms MS")),
                )
            }
            "--ivshmem-garbage" => a.ivshmem_garbage = true,
            "--ivshmem-no-read" => a.ivshmem_no_read = true,
            // QEMU's VM name: only read from the command line by a server.
            "-name" => drop(value()),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.guest_cs_duty.is_some() && (a.guest_cs.is_none() || !a.spin) {
        usage("--guest-cs-duty needs --guest-cs and --spin");
    }
    if a.region.as_os_str().is_empty() && a.ivshmem_server.is_none() {
        usage("--region PATH or --ivshmem-server SOCKET is required");
    }
    a
}

/// Maps the region once it exists and has a valid header, polling: the file
/// at `path`, or the descriptor an ivshmem server handed over (`shm`).
fn map_region_when_ready(
    path: PathBuf,
    shm: Option<OwnedFd>,
    vcpus: u32,
    into: Arc<OnceLock<RegionFile>>,
) {
    let open = move || match &shm {
        Some(fd) => fd
            .try_clone()
            .ok()
            .and_then(|fd| RegionFile::from_file(&path, std::fs::File::from(fd), vcpus).ok()),
        None => RegionFile::open(&path, vcpus).ok(),
    };
    std::thread::spawn(move || loop {
        if let Some(mut f) = open() {
            // Mapped from now on, as QEMU maps its memory backend whatever
            // the file holds: pvschedd finds the VMM by this mapping.
            loop {
                if let Ok(v) = f.region().validate() {
                    f.region_mut().adopt(&v);
                    let _ = into.set(f);
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    });
}

fn serve_qmp(path: PathBuf, tids: Vec<i64>) {
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap_or_else(|e| usage(&format!("qmp bind: {e}")));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(mut w) = conn.try_clone() else {
                continue;
            };
            let _ = w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n");
            for line in BufReader::new(conn).lines() {
                let Ok(line) = line else { break };
                let reply = if line.contains("query-cpus-fast") {
                    let cpus: Vec<String> = tids
                        .iter()
                        .enumerate()
                        .map(|(i, t)| format!("{{\"cpu-index\": {i}, \"thread-id\": {t}}}"))
                        .collect();
                    format!("{{\"return\": [{}]}}\n", cpus.join(", "))
                } else if line.contains("query-kvm") {
                    "{\"return\": {\"enabled\": false, \"present\": true}}\n".to_string()
                } else {
                    "{\"return\": {}}\n".to_string()
                };
                if w.write_all(reply.as_bytes()).is_err() {
                    break;
                }
            }
        }
    });
}

/// Connects to an ivshmem server as QEMU's ivshmem-doorbell does; returns
/// the connection (held while the VMM runs), the region's path through our
/// descriptor of it, and the host's doorbell. Exits 3 if it is refused.
fn connect_ivshmem(args: &Args) -> Option<(UnixStream, PathBuf, OwnedFd, OwnedFd)> {
    let path = args.ivshmem_server.as_ref()?;
    let refused = |why: String| -> ! {
        println!("ivshmem-refused {why}");
        let _ = std::io::stdout().flush();
        std::process::exit(3)
    };
    let conn = UnixStream::connect(path)
        .unwrap_or_else(|e| refused(format!("connect {}: {e}", path.display())));
    if args.ivshmem_no_read {
        return Some((
            conn,
            PathBuf::new(),
            ivshmem_placeholder(),
            ivshmem_placeholder(),
        ));
    }
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut served =
        ivshmem::client_handshake(&conn, 1).unwrap_or_else(|e| refused(format!("handshake: {e}")));
    if served.id != i64::from(ivshmem::CLIENT_ID) {
        refused(format!("client id {}", served.id));
    }
    let len = std::fs::File::from(
        served
            .shm
            .try_clone()
            .unwrap_or_else(|e| refused(e.to_string())),
    )
    .metadata()
    .map(|m| m.len())
    .unwrap_or(0);
    if !len.is_power_of_two() {
        refused(format!("region of {len} bytes: not a power of two"));
    }
    let region = PathBuf::from(format!("/proc/self/fd/{}", served.shm.as_raw_fd()));
    let bell = served.host_vectors.remove(0);
    if args.ivshmem_garbage {
        let _ = (&conn).write_all(b"not the ivshmem protocol");
    }
    Some((conn, region, served.shm, bell))
}

/// A descriptor to hold where a connection that never reads has none.
fn ivshmem_placeholder() -> OwnedFd {
    ivshmem::eventfd().unwrap_or_else(|e| usage(&format!("eventfd: {e}")))
}

fn main() {
    let mut args = parse_args();
    let served = connect_ivshmem(&args);
    if let Some((_, path, _, bell)) = &served {
        if !args.ivshmem_no_read {
            args.region = path.clone();
        } else {
            args.no_map = true;
        }
        if let Some(ms) = args.ring_every_ms.filter(|_| !args.ivshmem_no_read) {
            let bell = bell
                .try_clone()
                .unwrap_or_else(|e| usage(&format!("dup: {e}")));
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_millis(ms));
                let _ = ivshmem::ring(bell.as_fd());
            });
        }
    }
    let region: Arc<OnceLock<RegionFile>> = Arc::new(OnceLock::new());
    if !args.no_map {
        let shm = served
            .as_ref()
            .and_then(|(_, _, shm, _)| shm.try_clone().ok());
        map_region_when_ready(args.region.clone(), shm, args.vcpus, region.clone());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for i in 0..args.vcpus {
        let name = args.name_format.replace("{}", &i.to_string());
        let (tx, region, stop) = (tx.clone(), region.clone(), stop.clone());
        let spin = args.spin && args.spin_first.is_none_or(|n| i < n);
        let (fifo, cs) = (args.guest_fifo, args.guest_cs);
        let bursts = args.guest_rt_bursts;
        let duty = args.guest_cs_duty;
        // lock_holder: the holder's slot index + 1.
        let waits_for = args
            .guest_lock_wait
            .filter(|&(w, _)| w == i)
            .map(|(_, h)| h + 1);
        let pending = args.guest_pending.map_or(0, |p| {
            PENDING_VALID | (u64::from(POLICY_FIFO) << PENDING_POLICY_SHIFT) | u64::from(p)
        });
        let mut rt_switches = 0u64;
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _ = tx.send((i, gettid()));
                let born = Instant::now();
                // In its critical section now, by the duty cycle (always without one).
                let in_cs = || {
                    duty.is_none_or(|(hold, period)| {
                        (born.elapsed().as_micros() as u64) % period < hold
                    })
                };
                while !stop.load(Ordering::Relaxed) {
                    let held = in_cs();
                    let says = fifo.is_some()
                        || cs.is_some()
                        || bursts
                        || pending != 0
                        || waits_for.is_some();
                    if let Some(r) = region.get().filter(|_| says) {
                        rt_switches += u64::from(bursts);
                        let g = GuestHalf {
                            flags: GF_ACTIVE | if bursts { GF_IDLE } else { 0 },
                            policy: if fifo.is_some() { POLICY_FIFO } else { 0 },
                            rt_priority: fifo.unwrap_or(0),
                            cs_flags: if held { cs.unwrap_or(0) } else { 0 },
                            rt_switch_count: rt_switches,
                            guest_pending: pending,
                            lock_holder: waits_for.unwrap_or(0),
                            lock_flags: if waits_for.is_some() { LOCK_F_MUTEX } else { 0 },
                            ..GuestHalf::default()
                        };
                        let _ = r.region().write_guest(i, &g);
                    }
                    if spin {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_millis(1) {
                            // A duty cycle's flags are written as soon as they change.
                            if duty.is_some() && in_cs() != held {
                                break;
                            }
                            std::hint::spin_loop();
                        }
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
            .unwrap_or_else(|e| usage(&format!("spawn: {e}")));
        handles.push(h);
    }
    drop(tx);
    let mut tids: Vec<(u32, i32)> = rx.iter().take(args.vcpus as usize).collect();
    tids.sort_unstable();
    if let Some(qmp) = args.qmp {
        let reported = args
            .qmp_tids
            .unwrap_or_else(|| tids.iter().map(|t| i64::from(t.1)).collect());
        serve_qmp(qmp, reported);
    }
    let list: Vec<String> = tids.iter().map(|t| t.1.to_string()).collect();
    println!("ready {} {}", std::process::id(), list.join(" "));
    let _ = std::io::stdout().flush();
    match args.seconds {
        Some(s) => std::thread::sleep(Duration::from_secs_f64(s)),
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(served);
}
