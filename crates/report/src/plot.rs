//! Latency plots: per (load, interval), the complementary CDF of every mode
//! (log-x latency, log-y fraction of wakeups at least that late), guest and
//! host side by side. The tail, where the modes differ, gets most of the
//! picture. And bar charts of a figure per mode with its spread over the
//! repeats (throughput).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::{ReportError, Result};
use crate::stats::Histogram;

/// Font files tried, first found wins (fonts-dejavu-core).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// What registering the font gave, once per process.
#[derive(Clone, Copy)]
enum Font {
    Ready,
    Unusable(&'static str),
    Missing,
}

/// Registers a TrueType font as "sans-serif" once (plotters' ab_glyph
/// backend has no font of its own).
pub fn init_font() -> Result<()> {
    static DONE: OnceLock<Font> = OnceLock::new();
    let font = *DONE.get_or_init(|| {
        for f in FONTS {
            if let Ok(bytes) = std::fs::read(f) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return match plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                {
                    Ok(()) => Font::Ready,
                    Err(_) => Font::Unusable(f),
                };
            }
        }
        Font::Missing
    });
    match font {
        Font::Ready => Ok(()),
        Font::Unusable(f) => Err(ReportError::FontUnusable {
            path: f.to_string(),
        }),
        Font::Missing => Err(ReportError::NoFont {
            path: FONTS[0].to_string(),
        }),
    }
}

/// The colour of each mode, the same in every plot.
pub fn mode_color(mode: &str) -> RGBColor {
    match mode {
        "vanilla" => RGBColor(214, 39, 40),
        "static-rt" => RGBColor(31, 119, 180),
        "pvsched" => RGBColor(44, 160, 44),
        // pvsched without the guest doorbell: beside pvsched's curve.
        "pvsched-timer" => RGBColor(148, 103, 189),
        // The rogue scenario's cases.
        "pvsched-quiet" => RGBColor(31, 119, 180),
        "pvsched-rogue" => RGBColor(44, 160, 44),
        "vanilla-rogue" => RGBColor(214, 39, 40),
        "vanilla-quiet" => RGBColor(255, 127, 14),
        // The message-passing scenario's guest idle modes.
        "default" => RGBColor(214, 39, 40),
        "haltpoll" => RGBColor(255, 127, 14),
        "hinted" => RGBColor(44, 160, 44),
        "advisor" => RGBColor(31, 119, 180),
        // The lock-holder scenario's modes.
        "pvsched-nolock" => RGBColor(255, 127, 14),
        "pvsched-lock" => RGBColor(44, 160, 44),
        "pvsched-scx-nolock" => RGBColor(148, 103, 189),
        "pvsched-scx-lock" => RGBColor(31, 119, 180),
        _ => RGBColor(90, 90, 90),
    }
}

/// One curve: a mode's histogram.
pub struct Curve<'a> {
    pub mode: &'a str,
    pub hist: &'a Histogram,
}

/// A CCDF as a staircase: fraction >= x holds until the next bucket.
fn steps(h: &Histogram) -> Vec<(f64, f64)> {
    let pts = h.ccdf();
    let mut out = Vec::with_capacity(pts.len() * 2);
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i > 0 {
            out.push((x, pts[i - 1].1));
        }
        out.push((x, y));
    }
    // Close the last step at the maximum.
    if let Some(&(x, y)) = pts.last() {
        out.push((x * 1.02 + 1.0, y));
    }
    out
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn panel(
    area: &Area<'_>,
    path: &Path,
    title: &str,
    curves: &[Curve<'_>],
    interval_us: u32,
) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| ReportError::Plot {
        what: format!("{} ({title})", path.display()),
        msg: x.to_string(),
    };
    let xmax = curves
        .iter()
        .map(|c| c.hist.max_us)
        .max()
        .unwrap_or(10)
        .max(10) as f64
        * 1.5;
    let xmin = curves
        .iter()
        .filter_map(|c| c.hist.buckets.keys().next().copied())
        .min()
        .unwrap_or(1)
        .max(1) as f64
        * 0.8;
    let ymin = curves
        .iter()
        .filter(|c| c.hist.samples > 0)
        .map(|c| 1.0 / c.hist.samples as f64)
        .fold(1.0f64, f64::min)
        * 0.5;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..1.2f64).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log)")
        .y_desc("fraction of wakeups at least this late")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if *y >= 0.01 {
                format!("{y}")
            } else {
                format!("{y:.0e}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    // Reference lines: the interval, and the 1 % level (p99 is where a curve
    // crosses it).
    let refc = RGBColor(60, 60, 60);
    chart
        .draw_series(DashedLineSeries::new(
            [(interval_us as f64, ymin), (interval_us as f64, 1.2)],
            8,
            6,
            refc.stroke_width(2),
        ))
        .map_err(|x| e(&x))?
        .label(format!("dashed: interval ({interval_us} µs) and 1 % (p99)"))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], refc.stroke_width(2)));
    chart
        .draw_series(DashedLineSeries::new(
            [(xmin, 0.01), (xmax, 0.01)],
            8,
            6,
            refc.stroke_width(2),
        ))
        .map_err(|x| e(&x))?;
    for c in curves {
        if c.hist.samples == 0 {
            continue;
        }
        let color = mode_color(c.mode);
        let s = c.hist.summary();
        chart
            .draw_series(LineSeries::new(steps(c.hist), color.stroke_width(3)))
            .map_err(|x| e(&x))?
            .label(format!(
                "{}: p99 {} µs, max {} µs",
                c.mode, s.p99_us, s.max_us
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    Ok(())
}

/// Writes one PNG: guest on the left, host on the right.
pub fn latency_ccdf(
    path: &Path,
    title: &str,
    interval_us: u32,
    guest: &[Curve<'_>],
    host: &[Curve<'_>],
) -> Result<()> {
    init_font()?;
    let e = |x: &dyn std::fmt::Display| ReportError::Plot {
        what: path.display().to_string(),
        msg: x.to_string(),
    };
    let root = BitMapBackend::new(path, (1600, 680)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, body) = root.split_vertically(44);
    top.titled(title, ("sans-serif", 26)).map_err(|x| e(&x))?;
    let (left, right) = body.split_horizontally(800);
    panel(&left, path, "guest cyclictest", guest, interval_us)?;
    panel(&right, path, "host cyclictest", host, interval_us)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// One bar: a mode's median and the spread (min, max) over the repeats.
pub struct Bar<'a> {
    pub mode: &'a str,
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

/// One chart of bars, one per mode.
pub struct BarPanel<'a> {
    pub title: String,
    pub y_desc: String,
    pub bars: Vec<Bar<'a>>,
}

/// `12345` as `12.3 k`, for axis and bar labels.
fn short(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn bar_panel(area: &Area<'_>, path: &Path, p: &BarPanel<'_>) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| ReportError::Plot {
        what: format!("{} ({})", path.display(), p.title),
        msg: x.to_string(),
    };
    let n = p.bars.len().max(1);
    let top = p
        .bars
        .iter()
        .map(|b| b.high.max(b.value))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(72)
        // Bar i spans [i, i + 1), named above it (an axis of names needs
        // a discrete coordinate, which plotters cannot give one bar).
        .build_cartesian_2d(0.0..n as f64, 0.0..top)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(p.y_desc.as_str())
        .y_label_formatter(&|y| short(*y))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, b) in p.bars.iter().enumerate() {
        let x = i as f64;
        let color = mode_color(b.mode);
        chart
            .draw_series([Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, b.value)],
                color.filled(),
            )])
            .map_err(|x| e(&x))?;
        // The spread over the repeats, and the median written above it.
        chart
            .draw_series([PathElement::new(
                vec![(x + 0.5, b.low), (x + 0.5, b.high)],
                BLACK.stroke_width(2),
            )])
            .map_err(|x| e(&x))?;
        let style = TextStyle::from(("sans-serif", 15).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        let label = EmptyElement::at((x + 0.5, b.high.max(b.value)))
            + Text::new(short(b.value), (0, -2), style.clone())
            + Text::new(b.mode.to_string(), (0, -20), style);
        chart.draw_series([label]).map_err(|x| e(&x))?;
    }
    Ok(())
}

/// Writes one PNG of bar charts, `columns` per row, in the order given: a
/// bar per mode (its median), a black line for its spread.
pub fn bar_panels(path: &Path, title: &str, panels: &[BarPanel<'_>], columns: usize) -> Result<()> {
    init_font()?;
    let e = |x: &dyn std::fmt::Display| ReportError::Plot {
        what: path.display().to_string(),
        msg: x.to_string(),
    };
    let columns = columns.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(columns).max(1);
    let root = BitMapBackend::new(path, (560 * columns as u32, 420 * rows as u32 + 44))
        .into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (head, body) = root.split_vertically(44);
    head.titled(title, ("sans-serif", 24)).map_err(|x| e(&x))?;
    for (area, p) in body.split_evenly((rows, columns)).iter().zip(panels) {
        bar_panel(area, path, p)?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_hold_each_fraction_until_the_next_bucket() {
        let mut h = Histogram::default();
        h.record(10, 1);
        h.record(20, 1);
        let s = steps(&h);
        assert_eq!(s[0], (10.0, 1.0));
        assert_eq!(s[1], (20.0, 1.0));
        assert_eq!(s[2], (20.0, 0.5));
        assert!(s[3].0 > 20.0 && s[3].1 == 0.5);
    }

    #[test]
    fn large_numbers_are_shortened_for_labels() {
        assert_eq!(short(950.0), "950");
        assert_eq!(short(12_345.0), "12.3 k");
        assert_eq!(short(2_500_000.0), "2.50 M");
    }

    #[test]
    fn a_bar_chart_is_written_when_a_font_is_there() {
        if init_font().is_err() {
            eprintln!("no DejaVu font here: plot test skipped");
            return;
        }
        // Arrange
        let dir = std::env::temp_dir().join(format!("pvsched-report-bars-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bars.png");
        let bars = |v: f64| {
            vec![
                Bar {
                    mode: "default",
                    value: v,
                    low: v * 0.9,
                    high: v * 1.1,
                },
                Bar {
                    mode: "hinted",
                    value: v * 1.4,
                    low: v * 1.3,
                    high: v * 1.5,
                },
            ]
        };
        let mut panels: Vec<BarPanel> = [1000.0, 20_000.0, 5.0]
            .iter()
            .map(|&v| BarPanel {
                title: format!("{v}"),
                y_desc: "per s".into(),
                bars: bars(v),
            })
            .collect();
        panels[2].bars.truncate(1);

        // Act
        bar_panels(&path, "test", &panels, 2).unwrap();

        // Assert
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plot_is_written_when_a_font_is_there() {
        if init_font().is_err() {
            eprintln!("no DejaVu font here: plot test skipped");
            return;
        }
        // Arrange
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        for us in 1..200 {
            a.record(us * 10, 200 - us);
            b.record(us, 200 - us);
        }
        let dir = std::env::temp_dir().join(format!("pvsched-report-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.png");

        // Act
        let curves = [
            Curve {
                mode: "vanilla",
                hist: &a,
            },
            Curve {
                mode: "pvsched",
                hist: &b,
            },
        ];
        latency_ccdf(&path, "test", 1000, &curves, &curves).unwrap();

        // Assert
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
