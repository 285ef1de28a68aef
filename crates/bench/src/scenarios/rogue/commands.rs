//! What the rogue guest runs: rtspin at SCHED_FIFO on every vCPU, bounded,
//! and its stop; and how many spinners said they ran.

/// Longest a rogue rtspin runs if nothing kills it (the bench dying between
/// its start and its kill): the measurement and a margin.
pub(super) fn spin_bound(duration: u64) -> u64 {
    duration + 120
}

/// The guest command that starts the rogue on vCPUs `0..vcpus` and returns
/// at once: each rtspin's output goes to its own file, read after the stop
/// ([`READY_CMD`]). It does not wait in the guest for them to say they run:
/// with a FIFO spinner on every vCPU the guest's shell has only what RT
/// throttling leaves it, and a polling loop there took 35-60 s to see them
/// ready in the host VM (R6), past the bench's timeout in one session of two.
pub fn spin_cmd(vcpus: u32, priority: u32, secs: u64) -> String {
    let mut c = String::from("rm -f /tmp/rogue-*.log; ");
    for cpu in 0..vcpus {
        c.push_str(&format!(
            "rtspin -c {cpu} -P fifo -p {priority} -t {secs} -s 0 </dev/null \
             >/tmp/rogue-{cpu}.log 2>&1 & "
        ));
    }
    c.push_str("echo spawned");
    c
}

/// The guest command that prints what the rogue's rtspins said (after
/// [`STOP_CMD`], when the guest's shell has its CPUs back).
pub const READY_CMD: &str = "cat /tmp/rogue-*.log";

/// The guest command that stops the rogue and fails if an rtspin survives.
pub const STOP_CMD: &str = "killall rtspin 2>/dev/null; i=0; \
    while pidof rtspin >/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
    ! pidof rtspin >/dev/null";

/// rtspin processes that said they are ready, in a guest command's output.
pub fn count_ready(out: &str) -> u32 {
    out.lines().filter(|l| l.contains("rtspin: ready")).count() as u32
}
