//! `pvsched-sim`: runs a scenario in each of its modes (and variants) and prints the
//! table; `--json` and `--plot` write the rest.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use pvsched_sim::engine::{self, Mode};
use pvsched_sim::report;
use pvsched_sim::scenario::{Scenario, BUILT_IN};
use pvsched_sim::SimError;

#[derive(Parser, Debug)]
#[command(
    name = "pvsched-sim",
    about = "Simulates double scheduling (host and guest schedulers, VMs, workloads) in vanilla, \
             static-rt and pvsched modes, the last driven by the real pvsched policy",
    after_help = "Shipped scenarios: busy-host, hostvm-busy, idle-host, rogue-guest, lock-holder, \
                  message-passing, fleet (crates/sim/scenarios/). Every figure is simulated."
)]
struct Cli {
    /// A shipped scenario's name or a scenario TOML file.
    #[arg(long, required_unless_present = "list")]
    scenario: Option<String>,
    /// Modes to run [default: the scenario's].
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Cost set: kvm, tcg, or kvm-hostvm (KVM in the emulated host VM) [default: the
    /// scenario's].
    #[arg(long)]
    costs: Option<String>,
    /// Simulated seconds per mode [default: the scenario's].
    #[arg(long)]
    duration: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every result (histograms included) as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write latency CCDF plots (PNG) into DIR.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// List the shipped scenarios.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvsched-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), SimError> {
    if cli.list {
        for (name, text) in BUILT_IN {
            let sc = Scenario::parse(text, name)?;
            println!("{name}: {}", sc.description.lines().next().unwrap_or(""));
        }
        return Ok(());
    }
    let name = cli.scenario.as_deref().unwrap_or_default();
    let mut sc = Scenario::load(name)?;
    if let Some(m) = cli.modes {
        sc.modes = m;
    }
    if let Some(c) = cli.costs {
        sc.costs = c;
    }
    if let Some(d) = cli.duration {
        sc.duration_s = d;
    }
    // Overrides are checked like the file.
    let sc = Scenario::parse(
        &toml::to_string(&sc).map_err(|e| SimError::Scenario {
            what: name.into(),
            msg: e.to_string(),
        })?,
        name,
    )?;
    let modes: Vec<Mode> = sc.modes.iter().filter_map(|m| Mode::parse(m)).collect();
    let variants: Vec<Option<&pvsched_sim::scenario::Variant>> = if sc.variants.is_empty() {
        vec![None]
    } else {
        sc.variants.iter().map(Some).collect()
    };

    let started = Instant::now();
    let mut results = Vec::new();
    let total = variants.len() * modes.len();
    for (vi, variant) in variants.iter().enumerate() {
        for (mi, &mode) in modes.iter().enumerate() {
            let t0 = Instant::now();
            if !cli.quiet {
                eprintln!(
                    "pvsched-sim: [{}/{total}] {}{} {}",
                    vi * modes.len() + mi + 1,
                    sc.name,
                    variant.map(|v| format!("/{}", v.name)).unwrap_or_default(),
                    mode.name()
                );
            }
            let r = engine::run(&sc, *variant, mode, cli.seed, !cli.quiet)?;
            if !cli.quiet {
                let dt = t0.elapsed().as_secs_f64();
                eprintln!(
                    "pvsched-sim:   {} events in {dt:.1} s ({:.2} M events/s)",
                    r.events,
                    r.events as f64 / dt.max(1e-9) / 1e6
                );
            }
            results.push(r);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let events: u64 = results.iter().map(|r| r.events).sum();
    let targets = report::targets(&sc, &results);
    print!("{}", report::markdown(&sc, &results, &targets));
    println!(
        "Simulated events: {events} in {wall:.1} s wall ({:.2} M events/s on this machine).",
        events as f64 / wall.max(1e-9) / 1e6
    );
    if let Some(path) = &cli.json {
        let doc = serde_json::json!({
            "scenario": sc,
            "results": results,
            "targets": targets,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| SimError::Scenario {
            what: name.into(),
            msg: format!("serialising results: {e}"),
        })?;
        std::fs::write(path, text + "\n").map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(dir) = &cli.plot {
        for p in report::plots(&sc, &results, dir)? {
            eprintln!("pvsched-sim: wrote {}", p.display());
        }
    }
    Ok(())
}
