//! Fairness is enforced, not advisory: a guest that keeps asking for real-time gets at most
//! its VM's boost budget, an admin can take the budget away at run time, and `pvschedctl
//! status` shows each budget, its debt and the latch. Real pvschedd, a real fake VMM whose
//! guest halves claim a FIFO task on its vCPU while the vCPU thread spins, boosts observed on
//! the thread with sched_getattr.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pvsched_control::{Request, Response};
use pvsched_vmtest::wait_until;
use support::{
    params, tempdir, vm_name, wait_boosted, workspace_bin, Daemon, FakeVmm, FakeVmmConfig, ShmFile,
};

/// How late pvschedd may unboost after the boost budget ran dry, in wall-clock ms: far above
/// what a loaded runner shows (the overdraft it leaves was 0.1 ms here, 0.95 ms once on CI),
/// far below the 100 ms budget. A runner that stops altogether (a CI VM descheduled by its
/// own host) stops this test's RT sampler too: the longest gap it saw while the thread was
/// boosted is allowed on top. A debt of 177.8 ms was seen once on CI, before the message
/// carried the figures that tell a stalled runner from a late pvschedd.
const MAX_UNBOOST_LATENESS_MS: f64 = 5.0;

/// A fake VMM with one vCPU, spinning, whose guest says a FIFO 10 task runs; its QMP socket
/// in `dir`; and its `[[vm]]` entry. One vCPU: the test's sampling thread keeps the other CPU
/// while the vCPU thread spins boosted.
fn greedy_vmm(dir: &Path, name: &str, region: &Path) -> (FakeVmm, String) {
    let qmp = dir.join(format!("{name}.qmp"));
    let mut c = FakeVmmConfig::new(region);
    c.vcpus = 1;
    c.qmp = Some(qmp.clone());
    c.guest_fifo = Some(10);
    c.spin = true;
    let vmm = FakeVmm::spawn(&c);
    let entry = support::vm_entry(name, region, &qmp);
    (vmm, entry)
}

#[test]
fn a_guest_asking_for_rt_forever_is_boosted_only_within_its_budget_and_status_shows_the_latch() {
    let dir = tempdir("budget-greedy");
    let name = vm_name("greedy");
    let region = ShmFile::new(&name, 4096);
    let (vmm, entry) = greedy_vmm(&dir, &name, &region.0);
    // 10 % of the vCPU's time, banked over 1 s: 100 ms. max_boost alone (50 ms on, 50 ms
    // off) would give it 50 %.
    let limits = "[vm.limits]\nboost_share_permille = 100\nfairness_window_ns = 1_000_000_000\n";
    let d = Daemon::start(&dir, &format!("[discovery]\nauto = false\n{entry}{limits}"));
    d.wait_serving(&name, 1);
    let tid = vmm.tids[0];
    wait_boosted(&d, tid);

    // Sample the thread's policy for 4 s (about 4 budget cycles: 4 ms boosted, then demoted
    // and charged 3 ns per ns until the 100 ms bank is spent, ~36 ms in all; then 1 s
    // refused while it is earned back). The sampler runs RT, so that a stall it sees is
    // the runner's, not its own wait for a CPU the spinners hold.
    let observer = support::RtObserver::new();
    let (mut samples, mut boosted) = (0u32, 0u32);
    let (mut latched, mut rendered) = (None, None);
    // The longest the sampler went without a sample while the thread was boosted, before it
    // saw the latch (its own status calls not counted), and the longest boosted stretch it
    // saw.
    let (mut stalled, mut longest_boost) = (Duration::ZERO, Duration::ZERO);
    let mut slowest_status = Duration::ZERO;
    let mut boosted_since: Option<Instant> = None;
    let mut last = Instant::now();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        samples += 1;
        let at = Instant::now();
        if latched.is_none() && boosted_since.is_some() {
            stalled = stalled.max(at - last);
        }
        if params(tid).is_rt() {
            boosted += 1;
            let since = *boosted_since.get_or_insert(at);
            longest_boost = longest_boost.max(at - since);
        } else {
            boosted_since = None;
        }
        if latched.is_none() {
            let asked = Instant::now();
            let s = d.status();
            slowest_status = slowest_status.max(asked.elapsed());
            if s.vms[0].in_debt {
                let out = Command::new(workspace_bin("pvschedctl"))
                    .arg("--socket")
                    .arg(d.socket())
                    .arg("status")
                    .output()
                    .expect("run pvschedctl");
                rendered = Some(String::from_utf8_lossy(&out.stdout).into_owned());
                latched = Some(s);
            }
        }
        last = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(observer);

    let share = f64::from(boosted) / f64::from(samples);
    eprintln!(
        "boosted in {boosted} of {samples} samples ({:.1} %); longest stall while boosted {:.1} \
         ms, longest boosted stretch {:.1} ms, slowest status {:.1} ms",
        share * 100.0,
        stalled.as_secs_f64() * 1e3,
        longest_boost.as_secs_f64() * 1e3,
        slowest_status.as_secs_f64() * 1e3
    );
    assert!(share > 0.0, "never boosted at all");
    assert!(
        share < 0.25,
        "boosted {:.1} % of the time on a 10 % budget; log:\n{}",
        share * 100.0,
        d.log()
    );
    let latched = latched.unwrap_or_else(|| panic!("status never showed the latch"));
    let vm = &latched.vms[0];
    // The debt is the window's budget plus the overdraft: the boosted time between the
    // instant the bucket ran dry and pvschedd's unboost (its lateness), charged at the
    // demoted rate. A debt beyond that would mean the latch did not stop charging.
    let charge = f64::from(pvsched_policy::VmLimits::default().demoted_charge);
    let stalled_ms = stalled.as_secs_f64() * 1e3;
    let most = 100.0 + charge * (MAX_UNBOOST_LATENESS_MS + stalled_ms);
    assert!(
        vm.debt_ms > 0.0 && vm.debt_ms <= most,
        "debt {} ms, at most {most:.1} (the sampler stalled {stalled_ms:.1} ms while the thread \
         was boosted); log:\n{}",
        vm.debt_ms,
        d.log()
    );
    assert_eq!(vm.budget_ms, 0.0, "nothing left while latched");
    assert!(
        (vm.budget_max_ms - 100.0).abs() < 1e-6,
        "{}",
        vm.budget_max_ms
    );
    assert!(vm.over_budget >= 1);
    assert_eq!(vm.vcpus[0].reason, "over_budget");
    assert!(vm.vcpus[0].throttled);
    let text = rendered.unwrap_or_default();
    assert!(
        text.contains("boost budget SPENT: no boost until"),
        "pvschedctl status said:\n{text}"
    );
}

#[test]
fn an_admin_taking_the_budget_away_at_run_time_ends_a_boost_in_force_at_once() {
    let dir = tempdir("budget-set");
    let name = vm_name("set");
    let region = ShmFile::new(&name, 4096);
    let (vmm, entry) = greedy_vmm(&dir, &name, &region.0);
    // Boosts that would last 10 s on their own (the whole of the vCPU's time is its budget):
    // only the admin's change can end this one within the test.
    let limits = "[vm.limits]\nboost_share_permille = 1000\nmax_boost_ns = 10_000_000_000\n";
    let d = Daemon::start(&dir, &format!("[discovery]\nauto = false\n{entry}{limits}"));
    d.wait_serving(&name, 1);
    let tid = vmm.tids[0];
    wait_boosted(&d, tid);
    // The admin's requests are answered while the spinning vCPU is boosted: pvschedd's
    // control thread does not wait behind it (on a 2-CPU host it waited for the whole boost
    // when the kernel queued it on the spinner's CPU).
    let asked = Instant::now();

    let bad = d.request(
        &Request::Set {
            vm: Some(name.clone()),
            key: "cs_budget_ns".into(),
            value: "5_000_000".into(),
        },
        Duration::from_secs(5),
    );
    let set = d.request(
        &Request::Set {
            vm: Some(name.clone()),
            key: "boost_share_permille".into(),
            value: "0".into(),
        },
        Duration::from_secs(5),
    );
    let unboosted = wait_until(Duration::from_secs(2), Duration::from_millis(1), || {
        (!params(tid).is_rt()).then_some(())
    });
    let took = asked.elapsed();
    // Still refused a while later, whatever the guest keeps asking.
    let later = wait_until(Duration::from_millis(300), Duration::from_millis(5), || {
        params(tid).is_rt().then_some(())
    });

    match bad {
        Response::Error { message } => assert!(
            message.contains("cs_budget_ns") && message.contains("cs_window_ns"),
            "{message}"
        ),
        other => panic!("a critical-section budget above its window was accepted: {other:?}"),
    }
    assert!(matches!(set, Response::Ok { .. }), "{set:?}");
    assert!(unboosted.is_some(), "still boosted; log:\n{}", d.log());
    // Far above a request's round trip and an unboost (well under 1 ms idle), far below the
    // boost's own 10 s.
    assert!(
        took < Duration::from_secs(1),
        "the boost ended {took:?} after the admin asked; log:\n{}",
        d.log()
    );
    assert!(later.is_none(), "boosted again with no budget");
    let vm = &d.status().vms[0];
    assert!(vm.in_debt);
    assert_eq!(vm.vcpus[0].reason, "over_budget");
}
