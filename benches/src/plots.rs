// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! SVG line plots for the report, drawn with `plotters` from the series the
//! suites record with `SuiteReport::series`.

use std::error::Error;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::harness::Series;

/// How one plot is drawn.
pub struct PlotSpec {
    /// The id suites use in `SuiteReport::series`; also the SVG file stem.
    pub id: &'static str,
    /// Caption above the plot.
    pub title: &'static str,
    /// X axis description.
    pub x_desc: &'static str,
    /// Y axis description.
    pub y_desc: &'static str,
    /// Logarithmic x axis (for sizes spanning several decades).
    pub log_x: bool,
    /// Logarithmic y axis (for rates spanning several decades).
    pub log_y: bool,
}

/// The plots the report knows how to draw.
pub const PLOTS: &[PlotSpec] = &[
    PlotSpec {
        id: "msize_throughput",
        title: "9P sequential read by msize",
        x_desc: "msize (KiB, log scale)",
        y_desc: "GiB/s (log scale)",
        log_x: true,
        log_y: true,
    },
    PlotSpec {
        id: "prealloc_threads",
        title: "Preallocation throughput by thread count",
        x_desc: "threads",
        y_desc: "GiB/s",
        log_x: false,
        log_y: false,
    },
    PlotSpec {
        id: "burst_vmas",
        title: "Stack VMAs over the burst scenario",
        x_desc: "step: 1,000 coroutines created, a thread going idle, or the trim",
        y_desc: "VMAs held by the pool",
        log_x: false,
        log_y: false,
    },
];

/// Looks up how to draw `id`; unknown ids get a plain linear plot.
pub fn spec(id: &str) -> PlotSpec {
    PLOTS
        .iter()
        .find(|p| p.id == id)
        .map(|p| PlotSpec { ..*p })
        .unwrap_or(PlotSpec {
            id: "unknown",
            title: "unknown plot",
            x_desc: "x",
            y_desc: "y",
            log_x: false,
            log_y: false,
        })
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// A tick label: integers without a fraction, others with at most three
/// decimals and no trailing zeros.
fn tick_label(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws the mesh, one line with markers per series, and the legend (in the
/// top right corner, which `render` keeps free of data).
fn draw_lines<X, Y>(
    mut builder: ChartBuilder<'_, '_, SVGBackend<'_>>,
    x_range: X,
    y_range: Y,
    x_integer: bool,
    spec: &PlotSpec,
    series: &[&Series],
) -> Result<(), Box<dyn Error>>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = builder.build_cartesian_2d(x_range, y_range)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .x_label_formatter(&tick_label)
        .y_label_formatter(&tick_label);
    if x_integer {
        // Whole-number axes (threads) get no fractional ticks.
        mesh.x_label_formatter(&|v: &f64| {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        });
    }
    mesh.draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

/// Share of the plot height the data may use; the rest, at the top, is
/// left for the legend.
const DATA_HEIGHT: f64 = 0.62;

/// Draws every series of one plot into an SVG document.
pub fn render(spec: &PlotSpec, series: &[&Series]) -> Result<String, Box<dyn Error>> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_min, mut y_max) = (f64::INFINITY, 0.0f64);
    for &(x, y) in points {
        if !x.is_finite() || !y.is_finite() {
            return Err(format!("plot {} has a point that is not finite", spec.id).into());
        }
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
        if y > 0.0 {
            y_min = y_min.min(y);
        }
    }
    if !x_min.is_finite() || x_min >= x_max {
        return Err(format!("plot {} has fewer than two distinct x values", spec.id).into());
    }
    if (spec.log_x && x_min <= 0.0) || (spec.log_y && !(y_min.is_finite() && y_min > 0.0)) {
        return Err(format!("plot {} needs positive values on its log axis", spec.id).into());
    }
    let x_integer = !spec.log_x
        && series
            .iter()
            .flat_map(|s| s.points.iter())
            .all(|(x, _)| (x - x.round()).abs() < 1e-9);
    // A margin around the data so that edge markers are not cut.
    let (x_lo, x_hi) = if spec.log_x {
        (x_min / 1.25, x_max * 1.25)
    } else {
        let pad = (x_max - x_min) * 0.04;
        (x_min - pad, x_max + pad)
    };
    let (y_lo, y_hi) = if spec.log_y {
        let lo = y_min / 1.5;
        let span = (y_max.max(y_min * 1.01) / lo).ln();
        (lo, lo * (span / DATA_HEIGHT).exp())
    } else {
        (
            0.0,
            if y_max > 0.0 {
                y_max / DATA_HEIGHT
            } else {
                1.0
            },
        )
    };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 460)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(spec.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64);
        let (xr, yr) = (x_lo..x_hi, y_lo..y_hi);
        match (spec.log_x, spec.log_y) {
            (false, false) => draw_lines(builder, xr, yr, x_integer, spec, series)?,
            (true, false) => draw_lines(builder, xr.log_scale(), yr, x_integer, spec, series)?,
            (false, true) => draw_lines(builder, xr, yr.log_scale(), x_integer, spec, series)?,
            (true, true) => draw_lines(
                builder,
                xr.log_scale(),
                yr.log_scale(),
                x_integer,
                spec,
                series,
            )?,
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_render_draws_every_series() {
        let a = Series {
            plot: "msize_throughput".into(),
            label: "ours".into(),
            points: vec![(8.0, 0.1), (512.0, 1.0), (131072.0, 3.0)],
        };
        let b = Series {
            plot: "msize_throughput".into(),
            label: "peer".into(),
            points: vec![(8.0, 0.05), (64.0, 0.5)],
        };
        let svg = render(&spec("msize_throughput"), &[&a, &b]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("ours") && svg.contains("peer"));
    }

    #[test]
    fn test_render_refuses_zero_on_a_log_axis() {
        let a = Series {
            plot: "msize_throughput".into(),
            label: "ours".into(),
            points: vec![(8.0, 0.0), (64.0, 0.0)],
        };
        let err = render(&spec("msize_throughput"), &[&a]).unwrap_err();
        assert!(err.to_string().contains("log axis"), "{err}");
    }

    #[test]
    fn test_tick_label_drops_needless_decimals() {
        assert_eq!(tick_label(&70000.0), "70000");
        assert_eq!(tick_label(&0.25), "0.25");
        assert_eq!(tick_label(&0.30000000000000004), "0.3");
    }

    #[test]
    fn test_render_refuses_a_single_point() {
        let a = Series {
            plot: "prealloc_threads".into(),
            label: "ours".into(),
            points: vec![(1.0, 1.0)],
        };
        assert!(render(&spec("prealloc_threads"), &[&a]).is_err());
    }
}
