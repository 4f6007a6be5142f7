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
}

/// The plots the report knows how to draw.
pub const PLOTS: &[PlotSpec] = &[
    PlotSpec {
        id: "msize_throughput",
        title: "9P sequential read by msize",
        x_desc: "msize (KiB, log scale)",
        y_desc: "GiB/s",
        log_x: true,
    },
    PlotSpec {
        id: "prealloc_threads",
        title: "Preallocation throughput by thread count",
        x_desc: "threads",
        y_desc: "GiB/s",
        log_x: false,
    },
    PlotSpec {
        id: "burst_vmas",
        title: "Stack VMAs over the burst scenario",
        x_desc: "step",
        y_desc: "VMAs held by the pool",
        log_x: false,
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
        })
}

const COLORS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
];

/// Draws the mesh, one line with markers per series, and the legend.
fn draw_lines<X>(
    mut builder: ChartBuilder<'_, '_, SVGBackend<'_>>,
    x_range: X,
    y_max: f64,
    spec: &PlotSpec,
    series: &[&Series],
) -> Result<(), Box<dyn Error>>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = builder.build_cartesian_2d(x_range, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

/// Draws every series of one plot into an SVG document.
pub fn render(spec: &PlotSpec, series: &[&Series]) -> Result<String, Box<dyn Error>> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if !x_min.is_finite() || x_min >= x_max {
        return Err(format!("plot {} has fewer than two distinct x values", spec.id).into());
    }
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(spec.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60);
        if spec.log_x {
            draw_lines(builder, (x_min..x_max).log_scale(), y_max, spec, series)?;
        } else {
            draw_lines(builder, x_min..x_max, y_max, spec, series)?;
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
    fn test_render_refuses_a_single_point() {
        let a = Series {
            plot: "prealloc_threads".into(),
            label: "ours".into(),
            points: vec![(1.0, 1.0)],
        };
        assert!(render(&spec("prealloc_threads"), &[&a]).is_err());
    }
}
