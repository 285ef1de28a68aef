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

/// How late pvschedd may unboost after the boost budget ran dry (the overdraft it leaves):
/// far above what a loaded runner shows, far below the 100 ms budget.
const MAX_UNBOOST_LATENESS_MS: f64 = 20.0;

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

    // Sample the thread's policy for 4 s (about 4 budget cycles: ~111 ms boosted while the
    // 100 ms bank drains at 0.9 per ns, then 1 s refused while it is earned back).
    let (mut samples, mut boosted) = (0u32, 0u32);
    let (mut latched, mut rendered) = (None, None);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        samples += 1;
        boosted += u32::from(params(tid).is_rt());
        if latched.is_none() {
            let s = d.status();
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
        std::thread::sleep(Duration::from_millis(1));
    }

    let share = f64::from(boosted) / f64::from(samples);
    eprintln!(
        "boosted in {boosted} of {samples} samples ({:.1} %)",
        share * 100.0
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
    // instant the bucket ran dry and pvschedd's unboost (its lateness; 0.95 ms was seen on a
    // loaded 2-CPU CI runner). A debt beyond that would mean the latch did not stop charging.
    assert!(
        vm.debt_ms > 0.0 && vm.debt_ms <= 100.0 + MAX_UNBOOST_LATENESS_MS,
        "debt {} ms",
        vm.debt_ms
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
    let d = Daemon::start(&dir, &format!("[discovery]\nauto = false\n{entry}"));
    d.wait_serving(&name, 1);
    let tid = vmm.tids[0];
    wait_boosted(&d, tid);

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
    assert!(later.is_none(), "boosted again with no budget");
    let vm = &d.status().vms[0];
    assert!(vm.in_debt);
    assert_eq!(vm.vcpus[0].reason, "over_budget");
}
