//! What the rogue guest runs: rtspin at SCHED_FIFO on every vCPU, bounded,
//! and its stop; and how many spinners said they run.

/// Longest a rogue rtspin runs if nothing kills it (the bench dying between
/// its start and its kill): the measurement and a margin.
pub(super) fn spin_bound(duration: u64) -> u64 {
    duration + 120
}

/// The guest command that starts the rogue on vCPUs `0..vcpus` and returns
/// once every rtspin says it runs at SCHED_FIFO (or after ~30 s), printing
/// their lines. Each rtspin's output goes to its own file, so the command
/// does not wait for them.
pub fn spin_cmd(vcpus: u32, priority: u32, secs: u64) -> String {
    let mut c = String::from("rm -f /tmp/rogue-*.log; ");
    for cpu in 0..vcpus {
        c.push_str(&format!(
            "rtspin -c {cpu} -P fifo -p {priority} -t {secs} -s 0 </dev/null \
             >/tmp/rogue-{cpu}.log 2>&1 & "
        ));
    }
    c.push_str(&format!(
        "i=0; while [ \"$(cat /tmp/rogue-*.log 2>/dev/null | grep -c 'rtspin: ready')\" -lt {vcpus} ] \
         && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/rogue-*.log"
    ));
    c
}

/// The guest command that stops the rogue and fails if an rtspin survives.
pub const STOP_CMD: &str = "killall rtspin 2>/dev/null; i=0; \
    while pidof rtspin >/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
    ! pidof rtspin >/dev/null";

/// rtspin processes that said they are ready, in a guest command's output.
pub fn count_ready(out: &str) -> u32 {
    out.lines().filter(|l| l.contains("rtspin: ready")).count() as u32
}
