//! What every scenario's report.md writes alike: the lines about the run
//! under its title, and its tables.

use std::fmt::Write as _;

use super::meta::Meta;

/// Writes the lines under a report's title: the command, the machine, the
/// `tools` the scenario ran (pvsched's revision after them) and the
/// accelerator.
pub fn run_lines(o: &mut String, m: &Meta, tools: &[&str]) {
    let _ = writeln!(o, "Command: `{}`  ", m.command);
    let _ = writeln!(
        o,
        "Machine: {}, {} CPUs, {} GiB, kernel {}, {}  ",
        m.machine.cpu_model, m.machine.cpus, m.machine.memory_gib, m.machine.kernel, m.machine.os
    );
    let _ = writeln!(
        o,
        "Tools: {}; pvsched {}  ",
        tools.join("; "),
        m.machine.git
    );
    let _ = writeln!(o, "Accelerator: {}  ", m.accel_reason);
}

/// Writes a table's head: its `columns`, a name each; a name that ends in
/// `:` is a right-aligned (figure) column, written without the colon.
pub fn head(o: &mut String, columns: &[&str]) {
    let names: Vec<&str> = columns.iter().map(|c| c.trim_end_matches(':')).collect();
    let aligns: Vec<&str> = columns
        .iter()
        .map(|c| if c.ends_with(':') { "--:" } else { "---" })
        .collect();
    let _ = writeln!(o, "| {} |", names.join(" | "));
    let _ = writeln!(o, "|{}|", aligns.join("|"));
}

/// Writes one row of a table, its `cells` in the head's order.
pub fn row(o: &mut String, cells: &[String]) {
    let _ = writeln!(o, "| {} |", cells.join(" | "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_names_the_columns_and_aligns_the_figures_right() {
        let mut o = String::new();
        head(&mut o, &["load", "p99:"]);
        row(&mut o, &["idle".into(), "12".into()]);
        assert_eq!(o, "| load | p99 |\n|---|--:|\n| idle | 12 |\n");
    }
}
