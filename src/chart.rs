//! Line charts as SVG, for `replay --plot` and `bench --plot` (plotters, SVG
//! backend only: no system fonts or libraries; text is left to the viewer).
//!
//! Callers shape their figures into a [`LineChart`]; this module owns the
//! look: size, fonts, colours, markers and legend.

use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Evenly spaced decades; the range must be positive.
    Log,
}

/// One axis: its label, range, scale and tick precision.
#[derive(Clone, Debug)]
pub struct Axis {
    /// The axis description (", log scale" is appended on a log axis).
    pub label: String,
    /// Values covered by the axis.
    pub range: Range<f64>,
    /// Linear or logarithmic.
    pub scale: Scale,
    /// Digits after the decimal point on tick labels.
    pub decimals: usize,
}

impl Axis {
    /// A linear axis.
    pub fn linear(label: &str, range: Range<f64>, decimals: usize) -> Self {
        Self {
            label: label.to_owned(),
            range,
            scale: Scale::Linear,
            decimals,
        }
    }

    /// A logarithmic axis.
    pub fn log(label: &str, range: Range<f64>, decimals: usize) -> Self {
        Self {
            scale: Scale::Log,
            ..Self::linear(label, range, decimals)
        }
    }

    fn description(&self) -> String {
        match self.scale {
            Scale::Linear => self.label.clone(),
            Scale::Log => format!("{}, log scale", self.label),
        }
    }
}

/// One named line of `(x, y)` points, drawn in order.
pub type Series = (String, Vec<(f64, f64)>);

/// A titled chart of one or more lines, with a legend.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// Caption above the plot.
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// The lines, in legend order.
    pub series: Vec<Series>,
}

/// Groups `(name, point)` pairs into series, names in first-seen order and
/// each series' points sorted by x.
pub fn group<I: IntoIterator<Item = (String, (f64, f64))>>(points: I) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for (name, point) in points {
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, line)) => line.push(point),
            None => series.push((name, vec![point])),
        }
    }
    for (_, line) in &mut series {
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

impl LineChart {
    /// Writes the chart to `path` as SVG. Fails on an empty chart, an empty
    /// or non-finite range, a log range that is not positive, or I/O.
    pub fn draw(&self, path: &Path) -> Result<(), String> {
        if self.series.iter().all(|(_, points)| points.is_empty()) {
            return Err("nothing to plot".to_owned());
        }
        for axis in [&self.x, &self.y] {
            let Range { start, end } = axis.range;
            let positive = axis.scale == Scale::Linear || start > 0.0;
            if !(start.is_finite() && end.is_finite() && start < end && positive) {
                return Err(format!("bad range {start}..{end} for {}", axis.label));
            }
        }
        let (x, y) = (self.x.range.clone(), self.y.range.clone());
        // Each pair of scales is its own coordinate type in plotters.
        match (self.x.scale, self.y.scale) {
            (Scale::Linear, Scale::Linear) => self.render(path, x, y),
            (Scale::Linear, Scale::Log) => self.render(path, x, y.log_scale()),
            (Scale::Log, Scale::Linear) => self.render(path, x.log_scale(), y),
            (Scale::Log, Scale::Log) => self.render(path, x.log_scale(), y.log_scale()),
        }
    }

    fn render<X, Y>(&self, path: &Path, x: X, y: Y) -> Result<(), String>
    where
        X: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let err = |e: DrawingAreaErrorKind<_>| e.to_string();
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 26))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        let (x_decimals, y_decimals) = (self.x.decimals, self.y.decimals);
        chart
            .configure_mesh()
            .x_desc(self.x.description())
            .y_desc(self.y.description())
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .x_label_formatter(&|v| format!("{v:.x_decimals$}"))
            .y_label_formatter(&|v| format!("{v:.y_decimals$}"))
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(PointSeries::of_element(
                    points.iter().copied(),
                    4,
                    color.filled(),
                    &|c, s, st| Circle::new(c, s, st),
                ))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 17))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(x: Axis, y: Axis) -> LineChart {
        LineChart {
            title: "a title".into(),
            x,
            y,
            series: group([
                ("b".to_owned(), (2.0, 20.0)),
                ("a".to_owned(), (1.0, 5.0)),
                ("b".to_owned(), (1.0, 10.0)),
            ]),
        }
    }

    /// A chart file in a directory of its own, removed with it on drop.
    struct Scratch {
        dir: std::path::PathBuf,
        path: std::path::PathBuf,
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn scratch(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("radixd-chart-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{tag}.svg"));
        Scratch { dir, path }
    }

    #[test]
    fn group_keeps_first_seen_names_and_sorts_points() {
        let c = chart(
            Axis::linear("x", 0.0..3.0, 0),
            Axis::linear("y", 0.0..30.0, 0),
        );
        assert_eq!(
            c.series,
            vec![
                ("b".to_owned(), vec![(1.0, 10.0), (2.0, 20.0)]),
                ("a".to_owned(), vec![(1.0, 5.0)]),
            ]
        );
    }

    #[test]
    fn draws_every_scale_with_title_labels_and_legend() {
        let lin = |l| Axis::linear(l, 0.5..3.0, 1);
        let log = |l| Axis::log(l, 0.5..30.0, 1);
        for (tag, x, y) in [
            ("ll", lin("xs"), lin("ys")),
            ("lg", lin("xs"), log("ys")),
            ("gl", log("xs"), lin("ys")),
            ("gg", log("xs"), log("ys")),
        ] {
            let logs = [&x, &y].iter().filter(|a| a.scale == Scale::Log).count();
            let scratch = scratch(tag);
            let path = &scratch.path;
            chart(x, y).draw(path).unwrap();
            let svg = std::fs::read_to_string(path).unwrap();
            assert!(svg.contains("<svg") && svg.contains("a title"), "{tag}");
            assert!(svg.contains("xs") && svg.contains("ys"), "{tag}");
            assert_eq!(svg.matches("log scale").count(), logs, "{tag}");
            // plotters puts each text on a line of its own.
            for name in ["a", "b"] {
                assert!(svg.lines().any(|l| l.trim() == name), "{tag}: {name}");
            }
        }
    }

    #[test]
    fn refuses_empty_charts_and_bad_ranges() {
        let scratch = scratch("bad");
        let path = &scratch.path;
        let mut empty = chart(
            Axis::linear("x", 0.0..1.0, 0),
            Axis::linear("y", 0.0..1.0, 0),
        );
        empty.series.clear();
        assert_eq!(empty.draw(path), Err("nothing to plot".to_owned()));
        for (x, y) in [
            (Axis::log("x", 0.0..1.0, 0), Axis::linear("y", 0.0..1.0, 0)),
            (
                Axis::linear("x", 1.0..1.0, 0),
                Axis::linear("y", 0.0..1.0, 0),
            ),
            (
                Axis::linear("x", 0.0..1.0, 0),
                Axis::linear("y", 0.0..f64::NAN, 0),
            ),
        ] {
            let err = chart(x, y).draw(path).unwrap_err();
            assert!(err.starts_with("bad range"), "{err}");
        }
    }
}
