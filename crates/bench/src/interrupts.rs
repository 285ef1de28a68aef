//! The host's interrupts over a measured phase, from `/proc/interrupts`: local
//! timer interrupts, rescheduling IPIs (a thread woken for another CPU, or an
//! RT thread pushed or pulled there) and function-call IPIs, summed over the
//! CPUs. These are what a boost costs the host beyond CPU time: on a machine
//! that is itself a VM each one is an exit to the outer hypervisor.

use serde::{Deserialize, Serialize};

/// Counts of the rows this module reads, summed over the CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// `LOC`: local timer interrupts.
    pub local_timer: u64,
    /// `RES`: rescheduling IPIs.
    pub resched: u64,
    /// `CAL`: function-call IPIs.
    pub call: u64,
}

/// Per second over one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub local_timer: f64,
    pub resched: f64,
    pub call: f64,
}

/// Sums the per-CPU columns of the `LOC`, `RES` and `CAL` rows of `text`
/// (the format of `/proc/interrupts`); a row that is missing counts 0.
pub fn parse(text: &str) -> Counts {
    let mut c = Counts::default();
    for line in text.lines() {
        let Some((name, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let slot = match name {
            "LOC" => &mut c.local_timer,
            "RES" => &mut c.resched,
            "CAL" => &mut c.call,
            _ => continue,
        };
        // Per-CPU counts come first; the description follows.
        *slot = rest
            .split_whitespace()
            .map_while(|w| w.parse::<u64>().ok())
            .sum();
    }
    c
}

/// `/proc/interrupts` now; None if it cannot be read.
pub fn sample() -> Option<Counts> {
    std::fs::read_to_string("/proc/interrupts")
        .ok()
        .map(|t| parse(&t))
}

/// Rates from `a` to `b`, `seconds` apart (counters that went back count 0).
pub fn rates(a: &Counts, b: &Counts, seconds: f64) -> Option<Rates> {
    (seconds > 0.0).then(|| Rates {
        local_timer: b.local_timer.saturating_sub(a.local_timer) as f64 / seconds,
        resched: b.resched.saturating_sub(a.resched) as f64 / seconds,
        call: b.call.saturating_sub(a.call) as f64 / seconds,
    })
}

/// The mean of `rates` (None when empty).
pub fn mean(rates: &[Rates]) -> Option<Rates> {
    if rates.is_empty() {
        return None;
    }
    let n = rates.len() as f64;
    Some(Rates {
        local_timer: rates.iter().map(|r| r.local_timer).sum::<f64>() / n,
        resched: rates.iter().map(|r| r.resched).sum::<f64>() / n,
        call: rates.iter().map(|r| r.call).sum::<f64>() / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "           CPU0       CPU1       \n\
 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n\
LOC:     740865     827535   Local timer interrupts\n\
RES:     287827     284604   Rescheduling interrupts\n\
CAL:     190392     167432   Function call interrupts\n\
TLB:      91258      96158   TLB shootdowns\n";

    #[test]
    fn the_rows_are_summed_over_the_cpus_and_the_rest_is_ignored() {
        let c = parse(TEXT);

        assert_eq!(
            c,
            Counts {
                local_timer: 740865 + 827535,
                resched: 287827 + 284604,
                call: 190392 + 167432,
            }
        );
        assert_eq!(parse("garbage\n"), Counts::default());
    }

    #[test]
    fn rates_are_per_second_and_never_negative() {
        let a = Counts {
            local_timer: 100,
            resched: 50,
            call: 10,
        };
        let b = Counts {
            local_timer: 2100,
            resched: 40,
            call: 30,
        };

        let r = rates(&a, &b, 2.0).unwrap();

        assert_eq!((r.local_timer, r.resched, r.call), (1000.0, 0.0, 10.0));
        assert!(rates(&a, &b, 0.0).is_none());
        let m = mean(&[r, Rates::default()]).unwrap();
        assert_eq!(m.local_timer, 500.0);
    }
}
