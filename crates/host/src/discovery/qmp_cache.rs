//! The vCPU threads QMP named for each configured VM, reused between full
//! queries while the VMM and every one of those threads live on unchanged.
//!
//! A full query connects to QEMU's monitor and asks `query-cpus-fast` and
//! `query-kvm`: work for pvschedd and for QEMU's main loop, every round
//! (each second) otherwise; in an emulated host it cost QEMU's main loop
//! 2 % of the machine. Between full queries a round re-checks what the
//! query established, on what it holds since: the process's status file,
//! kept open (still an allowed VMM; a read fails once the process is gone,
//! even if its pid was reused), and a handle on the process and each
//! thread (one `poll` of their pidfds where the kernel has thread pidfds,
//! 6.9+; else each start time from /proc). Each system call of a round
//! counts on an emulated host. vCPU hotplug adds a thread no check sees: a
//! full query every [`REQUERY`] bounds how late it is served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_base::procfs::ProcFile;
use pvsched_base::thread::ThreadHandle;

use super::DiscoveryError;
use crate::config::Allowed;
use crate::discovery::vmm::check_vmm_status;
use crate::found::VmThreads;

/// Longest a QMP answer is reused.
pub const REQUERY: Duration = Duration::from_secs(10);

struct Entry {
    socket: PathBuf,
    threads: VmThreads,
    /// The process's `/proc/<pid>/status`, open since the answer.
    status: ProcFile,
    /// The process and each of its threads in `threads`.
    handles: Vec<ThreadHandle>,
    queried: Instant,
}

#[derive(Default)]
pub struct QmpCache {
    entries: HashMap<String, Entry>,
    /// Scratch text of the status reads.
    text: String,
}

impl QmpCache {
    /// VM `name`'s threads: the last answer of its QMP socket `socket` while
    /// it holds, else `query`'s (remembered when it succeeds).
    pub fn threads(
        &mut self,
        name: &str,
        socket: &Path,
        allowed: &Allowed,
        now: Instant,
        query: impl FnOnce() -> Result<VmThreads, DiscoveryError>,
    ) -> Result<VmThreads, DiscoveryError> {
        if let Some(e) = self.entries.get(name) {
            if e.socket == socket
                && now.saturating_duration_since(e.queried) < REQUERY
                && still_holds(e, &mut self.text, allowed)
            {
                return Ok(e.threads.clone());
            }
        }
        self.entries.remove(name);
        let threads = query()?;
        if let Some((status, handles)) = held(&threads) {
            self.entries.insert(
                name.to_string(),
                Entry {
                    socket: socket.to_path_buf(),
                    threads: threads.clone(),
                    status,
                    handles,
                    queried: now,
                },
            );
        }
        Ok(threads)
    }

    /// Forgets every answer: the next round queries each VM (a rescan was
    /// asked for: something changed that /proc may not show).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Forgets the VMs not named in `names` (no longer configured).
    pub fn retain(&mut self, names: &[&str]) {
        self.entries.retain(|n, _| names.contains(&n.as_str()));
    }
}

/// The process's status file and handles on it and its threads, opened
/// after the answer; None if any is gone (the answer is not kept then).
fn held(t: &VmThreads) -> Option<(ProcFile, Vec<ThreadHandle>)> {
    let status = ProcFile::open(format!("/proc/{}/status", t.tgid)).ok()?;
    let handles = std::iter::once(t.tgid)
        .chain(t.vcpus.iter().map(|&(_, tid)| tid))
        .chain(t.latency_path.iter().copied())
        .map(|tid| ThreadHandle::open(t.tgid, tid).ok())
        .collect::<Option<Vec<_>>>()?;
    Some((status, handles))
}

fn still_holds(e: &Entry, text: &mut String, allowed: &Allowed) -> bool {
    check_vmm_status(e.threads.tgid, &e.status, text, allowed).is_ok()
        && ThreadHandle::all_alive(&e.handles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvsched_base::vcpu_names::Accel;
    use std::cell::Cell;
    use std::process::{Child, Command};

    /// A real process standing for a VMM whose main thread is its one vCPU.
    struct Vmm(Child);

    impl Vmm {
        fn start() -> Self {
            Vmm(Command::new("sleep").arg("60").spawn().unwrap())
        }
        fn threads(&self) -> VmThreads {
            let pid = self.0.id() as i32;
            VmThreads {
                tgid: pid,
                vcpus: vec![(0, pid)],
                latency_path: Vec::new(),
                accel: Accel::Kvm,
            }
        }
    }

    impl Drop for Vmm {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn us() -> Allowed {
        Allowed {
            uids: [nix::unistd::getuid().as_raw()].into_iter().collect(),
            ..Allowed::default()
        }
    }

    /// A VMM's QMP socket that counts the queries it answers.
    struct Socket {
        vmm: Vmm,
        queries: Cell<u32>,
    }

    impl Socket {
        fn new() -> Self {
            Socket {
                vmm: Vmm::start(),
                queries: Cell::new(0),
            }
        }
        fn query(&self) -> Result<VmThreads, DiscoveryError> {
            self.queries.set(self.queries.get() + 1);
            Ok(self.vmm.threads())
        }
    }

    /// The VM's QMP socket (never opened: `Socket` answers for it).
    fn sock() -> &'static Path {
        Path::new("/run/vm.qmp")
    }

    #[test]
    fn an_answer_is_reused_while_the_vmm_and_its_threads_live_on() {
        let (qmp, mut cache, sock, t0) =
            (Socket::new(), QmpCache::default(), sock(), Instant::now());
        let (query, queries) = (|| qmp.query(), &qmp.queries);

        let first = cache.threads("vm", sock, &us(), t0, query).unwrap();
        let later = t0 + Duration::from_secs(1);
        let again = cache.threads("vm", sock, &us(), later, query).unwrap();

        assert_eq!((queries.get(), &again), (1, &first));
        cache
            .threads("vm", Path::new("/run/other.qmp"), &us(), later, query)
            .unwrap();
        assert_eq!(queries.get(), 2, "another socket is asked");
    }

    #[test]
    fn an_answer_is_asked_again_when_a_thread_it_named_ends() {
        let (qmp, mut cache, sock, t0) =
            (Socket::new(), QmpCache::default(), sock(), Instant::now());
        let (query, queries) = (|| qmp.query(), &qmp.queries);
        cache.threads("vm", sock, &us(), t0, query).unwrap();
        // One of the threads the answer named (a thread of this test
        // process stands for it: the VMM, `sleep`, has one thread) ends.
        let (tx, rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(pvsched_base::thread::gettid()).unwrap();
            end_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let handle = ThreadHandle::open(std::process::id() as i32, tid).unwrap();
        cache.entries.get_mut("vm").unwrap().handles.push(handle);
        cache.threads("vm", sock, &us(), t0, query).unwrap();
        assert_eq!(queries.get(), 1, "asked once while every thread lives");
        end_tx.send(()).unwrap();
        t.join().unwrap();
        // A joined thread may still be listed in /proc for a moment.
        let listed = format!("/proc/self/task/{tid}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Path::new(&listed).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }

        cache.threads("vm", sock, &us(), t0, query).unwrap();

        assert_eq!(queries.get(), 2);
    }

    #[test]
    fn an_answer_is_asked_again_when_the_vmm_ends() {
        let mut vmm = Vmm::start();
        let (mut cache, sock, t0) = (QmpCache::default(), sock(), Instant::now());
        let gone = vmm.threads();
        cache
            .threads("vm", sock, &us(), t0, || Ok(gone.clone()))
            .unwrap();
        vmm.0.kill().unwrap();
        vmm.0.wait().unwrap();

        let r = cache.threads("vm", sock, &us(), t0, || {
            Err(DiscoveryError::SelfProcess(1))
        });

        assert!(
            r.is_err(),
            "the old answer is not served for a VMM that ended"
        );
    }

    #[test]
    fn an_answer_is_asked_again_after_the_requery_interval_a_clear_or_a_refusal() {
        let (qmp, mut cache, sock, t0) =
            (Socket::new(), QmpCache::default(), sock(), Instant::now());
        let (query, queries) = (|| qmp.query(), &qmp.queries);
        cache.threads("vm", sock, &us(), t0, query).unwrap();
        cache
            .threads("vm", sock, &us(), t0 + REQUERY, query)
            .unwrap();
        assert_eq!(queries.get(), 2, "old answer");
        cache.clear();
        cache
            .threads("vm", sock, &us(), t0 + REQUERY, query)
            .unwrap();
        assert_eq!(queries.get(), 3, "cleared");
        cache
            .threads("vm", sock, &Allowed::default(), t0 + REQUERY, query)
            .unwrap();
        assert_eq!(
            queries.get(),
            4,
            "its account no longer allowed: the query's checks again"
        );

        let mut failing = QmpCache::default();
        let refused = || Err(DiscoveryError::SelfProcess(1));
        assert!(failing.threads("vm", sock, &us(), t0, refused).is_err());
        failing.threads("vm", sock, &us(), t0, query).unwrap();
        assert_eq!(queries.get(), 5, "a failed query is not remembered");
    }
}
