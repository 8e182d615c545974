//! Line charts as PNG and SVG (plotters), for the numbers people would rather look at than
//! read: bus bandwidth over message size, GEMM throughput over a dimension, loss per phase,
//! scores per phase.
//!
//! The font is DejaVu Sans compiled into the binary (the `dejavu` crate) and drawn by
//! plotters' pure-Rust `ab_glyph` backend, so a chart renders the same on a machine with no
//! fonts or fontconfig installed.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{Context, Result, ensure};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Marks only, no connecting line (a subset highlighted on another line).
    pub marks_only: bool,
}

impl Series {
    /// A line through `points`.
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            marks_only: false,
        }
    }
}

/// How an axis maps values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scale {
    /// Evenly spaced values.
    #[default]
    Linear,
    /// Powers of two (message sizes, matrix dimensions): base-2 log, ticks labelled 1K, 1M, ...
    Log2,
}

/// A chart: title, axes, lines.
#[derive(Clone, Debug, Default)]
pub struct LineChart {
    /// Drawn above the plot.
    pub title: String,
    /// The x axis caption.
    pub x_label: String,
    /// The y axis caption.
    pub y_label: String,
    /// How x values map onto the axis.
    pub x_scale: Scale,
    /// Names for integer x positions (phases, tasks) in place of numbers.
    pub x_names: Vec<String>,
    /// The lines.
    pub series: Vec<Series>,
}

impl LineChart {
    /// Writes `<stem>.png` and `<stem>.svg`; returns both paths.
    pub fn write(&self, stem: &Path) -> Result<[PathBuf; 2]> {
        let png = stem.with_extension("png");
        let svg = stem.with_extension("svg");
        let size = (960, 600);
        self.draw(BitMapBackend::new(&png, size).into_drawing_area())
            .with_context(|| format!("drawing {}", png.display()))?;
        self.draw(SVGBackend::new(&svg, size).into_drawing_area())
            .with_context(|| format!("drawing {}", svg.display()))?;
        Ok([png, svg])
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        register_font();
        let points = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().copied())
                .filter(|(x, y)| x.is_finite() && y.is_finite())
        };
        ensure!(points().next().is_some(), "{}: nothing to plot", self.title);
        let fold = |f: fn(&(f64, f64)) -> f64| {
            points()
                .map(|p| f(&p))
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
        };
        let (x_lo, x_hi) = fold(|p| p.0);
        let (y_lo, y_hi) = fold(|p| p.1);
        let x = match self.x_scale {
            // Named positions get half a step of room, so the end labels are not cut off.
            Scale::Linear if !self.x_names.is_empty() => (x_lo - 0.5, x_hi + 0.5),
            Scale::Linear => widen(x_lo, x_hi, 0.0),
            Scale::Log2 => (
                x_lo.max(f64::MIN_POSITIVE).log2(),
                x_hi.max(f64::MIN_POSITIVE).log2(),
            ),
        };
        let x = if x.0 == x.1 {
            (x.0 - 0.5, x.1 + 0.5)
        } else {
            x
        };
        let y = widen(y_lo.min(0.0), y_hi, 0.05);

        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x.0..x.1, y.0..y.1)?;
        let x_names = &self.x_names;
        let scale = self.x_scale;
        let format_x = move |v: &f64| match scale {
            Scale::Log2 => bytes_label(2f64.powf(*v)),
            Scale::Linear if !x_names.is_empty() => {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    x_names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
            Scale::Linear => short_number(*v),
        };
        let x_ticks = match (self.x_scale, x_names.is_empty()) {
            (Scale::Log2, _) => ((x.1 - x.0).round() as usize + 1).min(12),
            (Scale::Linear, false) => x_names.len() * 2 + 1,
            (Scale::Linear, true) => 10,
        };
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_labels(x_ticks)
            .x_label_formatter(&format_x)
            .y_label_formatter(&|v| short_number(*v))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let to_axis =
                |&(px, py): &(f64, f64)| (if scale == Scale::Log2 { px.log2() } else { px }, py);
            let line: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .map(to_axis)
                .collect();
            let marks = line
                .iter()
                .map(|&p| Circle::new(p, if s.marks_only { 6 } else { 3 }, color.filled()))
                .collect::<Vec<_>>();
            let drawn = if s.marks_only {
                chart.draw_series(marks)?
            } else {
                chart.draw_series(marks)?;
                chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?
            };
            if s.marks_only {
                drawn
                    .label(&s.name)
                    .legend(move |(lx, ly)| Circle::new((lx + 9, ly), 6, color.filled()));
            } else {
                drawn.label(&s.name).legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 18, ly)], color.stroke_width(2))
                });
            }
        }
        if self.series.len() > 1 || self.series.iter().any(|s| !s.name.is_empty()) {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .label_font(("sans-serif", 14))
                .draw()?;
        }
        root.present()?;
        Ok(())
    }
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font parses; a failure here would be a broken `dejavu` crate.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// `lo..hi` with `pad` of the span added above (and below unless `lo` is 0).
fn widen(lo: f64, hi: f64, pad: f64) -> (f64, f64) {
    let span = (hi - lo).max(hi.abs() * 1e-3).max(1e-12);
    let below = if lo == 0.0 { 0.0 } else { span * pad };
    (lo - below, hi + span * pad)
}

/// 1024 -> "1K", 1048576 -> "1M" (binary), for power-of-two axes.
pub fn bytes_label(v: f64) -> String {
    let v = v.round();
    for (unit, name) in [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")] {
        let u = unit as f64;
        if v >= u {
            let q = v / u;
            return if q.fract() == 0.0 {
                format!("{q:.0}{name}")
            } else {
                format!("{q:.1}{name}")
            };
        }
    }
    format!("{v:.0}")
}

/// A compact tick label: 12000 -> "12k", 0.25 -> "0.25".
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_powers_of_two_in_binary_units() {
        assert_eq!(bytes_label(1024.0), "1K");
        assert_eq!(bytes_label(3.0 * 1024.0 * 1024.0), "3M");
        assert_eq!(bytes_label(1536.0), "1.5K");
        assert_eq!(bytes_label(512.0), "512");
        assert_eq!(short_number(12_000.0), "12k");
        assert_eq!(short_number(0.25), "0.25");
    }

    #[test]
    fn writes_png_and_svg_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let chart = LineChart {
            title: "bus bandwidth".into(),
            x_label: "message size".into(),
            y_label: "GB/s".into(),
            x_scale: Scale::Log2,
            x_names: vec![],
            series: vec![
                Series::line("2 ranks", vec![(1024.0, 0.1), (1048576.0, 1.2)]),
                Series::line("4 ranks", vec![(1024.0, 0.05), (1048576.0, 0.9)]),
            ],
        };
        let [png, svg] = chart.write(&dir.path().join("busbw")).unwrap();
        let png = std::fs::read(png).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(
            svg.contains("4 ranks") && svg.contains("1K") && svg.contains("1M"),
            "labels missing from the SVG"
        );
        let empty = LineChart {
            title: "t".into(),
            ..Default::default()
        };
        let err = format!("{:#}", empty.write(&dir.path().join("e")).unwrap_err());
        assert!(err.contains("nothing to plot"), "{err}");
        if let Ok(keep) = std::env::var("ZFLOW_KEEP_PLOTS") {
            chart.write(&Path::new(&keep).join("busbw")).unwrap();
        }
    }
}
