//! Line charts as SVG, drawn on the server: no chart library in the
//! browser, nothing for the Content-Security-Policy to let in, and a page
//! that reads the same with scripts off. Colours and dashes tell the
//! series apart; the legend says which is which in words, and the chart's
//! `<title>` and `<desc>` say what it shows to a screen reader.

use maud::{html, Markup};

/// One line: `(x, y)` points, `None` y where there is no value (a gap).
pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, Option<f64>)>,
    pub style: Style,
}

/// A horizontal line (a threshold) with its label.
pub struct Threshold<'a> {
    pub name: &'a str,
    pub y: f64,
}

/// A vertical mark at `x` (an event on the time axis).
pub struct Mark {
    pub x: f64,
    pub label: String,
}

#[derive(Debug, Clone, Copy)]
pub enum Style {
    Solid(&'static str),
    Dashed(&'static str),
}

impl Style {
    fn colour(self) -> &'static str {
        match self {
            Style::Solid(c) | Style::Dashed(c) => c,
        }
    }

    fn dash(self) -> Option<&'static str> {
        match self {
            Style::Solid(_) => None,
            Style::Dashed(_) => Some("6 4"),
        }
    }
}

/// Colours with at least 4.5:1 contrast on white.
pub const BLUE: &str = "#0b57b0";
pub const ORANGE: &str = "#a34700";
pub const GREEN: &str = "#1e6b34";
pub const PURPLE: &str = "#6a3d9a";

const W: f64 = 640.0;
const H: f64 = 220.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// The value range a chart shows: the data's, the thresholds' and zero,
/// with a little room above.
fn y_range(series: &[Series<'_>], thresholds: &[Threshold<'_>]) -> (f64, f64) {
    let ys = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .chain(thresholds.iter().map(|t| t.y))
        .filter(|y| y.is_finite());
    let (lo, hi) = ys.fold((0.0_f64, 0.0_f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if hi - lo < 1e-12 {
        (lo, lo + 1.0)
    } else {
        (lo, hi + (hi - lo) * 0.08)
    }
}

fn x_range(series: &[Series<'_>], marks: &[Mark]) -> (f64, f64) {
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.x))
        .filter(|x| x.is_finite());
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi - lo < 1e-12 {
        (lo - 0.5, lo + 0.5)
    } else {
        (lo, hi)
    }
}

/// A value's place on a scale of `len` pixels starting at `from`.
fn scale(v: f64, (lo, hi): (f64, f64), from: f64, len: f64) -> f64 {
    from + (v - lo) / (hi - lo) * len
}

/// The SVG path of a series: a new segment after every gap.
fn path(points: &[(f64, Option<f64>)], xr: (f64, f64), yr: (f64, f64)) -> String {
    let mut d = String::new();
    let mut pen_down = false;
    for (x, y) in points {
        match y.filter(|y| y.is_finite()) {
            Some(y) => {
                let px = scale(*x, xr, LEFT, W - LEFT - RIGHT);
                let py = scale(y, yr, H - BOTTOM, -(H - TOP - BOTTOM));
                d.push_str(&format!(
                    "{}{px:.1},{py:.1} ",
                    if pen_down { "L" } else { "M" }
                ));
                pen_down = true;
            }
            None => pen_down = false,
        }
    }
    d.trim_end().to_string()
}

/// A chart of `series` with `thresholds` drawn across and `marks` down;
/// `x_label` formats an x value for the axis.
pub fn line_chart(
    title: &str,
    series: &[Series<'_>],
    thresholds: &[Threshold<'_>],
    marks: &[Mark],
    x_label: impl Fn(f64) -> String,
) -> Markup {
    let xr = x_range(series, marks);
    let yr = y_range(series, thresholds);
    let ticks = [yr.0, (yr.0 + yr.1) / 2.0, yr.1];
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    html! {
        figure.chart {
            svg viewBox={"0 0 " (W) " " (H)} role="img" width="100%" preserveAspectRatio="xMidYMid meet" {
                title { (title) }
                desc { "Lines: " (names.join(", ")) ". Thresholds: "
                    @for t in thresholds { (t.name) " at " (format!("{:.3}", t.y)) "; " } }
                rect x=(LEFT) y=(TOP) width=(plot_w) height=(plot_h) fill="#ffffff" stroke="#c9d0d9" {}
                @for t in ticks {
                    @let y = scale(t, yr, H - BOTTOM, -plot_h);
                    text x=(LEFT - 4.0) y=(format!("{:.1}", y + 4.0)) text-anchor="end" font-size="11" fill="#4a5360" { (format!("{t:.2}")) }
                }
                text x=(LEFT) y=(H - 8.0) font-size="11" fill="#4a5360" { (x_label(xr.0)) }
                text x=(W - RIGHT) y=(H - 8.0) font-size="11" text-anchor="end" fill="#4a5360" { (x_label(xr.1)) }
                @for t in thresholds {
                    @let y = scale(t.y, yr, H - BOTTOM, -plot_h);
                    line x1=(LEFT) x2=(W - RIGHT) y1=(format!("{y:.1}")) y2=(format!("{y:.1}"))
                        stroke="#8a1111" stroke-width="1" stroke-dasharray="2 3" {}
                    text x=(W - RIGHT - 2.0) y=(format!("{:.1}", y - 3.0)) text-anchor="end" font-size="11" fill="#8a1111" { (t.name) }
                }
                @for (i, m) in marks.iter().enumerate() {
                    @let x = scale(m.x, xr, LEFT, plot_w);
                    // Marks close together (drift flagged, the retrain, the
                    // new version serving) would print over each other:
                    // their labels step down, and near the right edge they
                    // end at their line instead of starting there.
                    @let y = TOP + 11.0 + 12.0 * (i % 3) as f64;
                    @let right = x > W - RIGHT - 100.0;
                    line x1=(format!("{x:.1}")) x2=(format!("{x:.1}")) y1=(TOP) y2=(H - BOTTOM)
                        stroke="#3b4350" stroke-width="1" {}
                    text x=(format!("{:.1}", if right { x - 3.0 } else { x + 3.0 })) y=(format!("{y:.1}"))
                        text-anchor=(if right { "end" } else { "start" }) font-size="11" fill="#3b4350" { (m.label) }
                }
                @for s in series {
                    path d=(path(&s.points, xr, yr)) fill="none" stroke=(s.style.colour())
                        stroke-width="2" stroke-dasharray=[s.style.dash()] {}
                }
            }
            figcaption {
                (title) ": "
                @for (i, s) in series.iter().enumerate() {
                    @if i > 0 { ", " }
                    span.swatch {
                        svg width="24" height="8" aria-hidden="true" {
                            line x1="0" x2="24" y1="4" y2="4" stroke=(s.style.colour()) stroke-width="2"
                                stroke-dasharray=[s.style.dash()] {}
                        }
                    }
                    " " (s.name)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_starts_a_new_segment_and_points_land_inside_the_plot() {
        let pts = vec![
            (0.0, Some(0.0)),
            (1.0, Some(1.0)),
            (2.0, None),
            (3.0, Some(0.5)),
        ];
        let d = path(&pts, (0.0, 3.0), (0.0, 1.0));
        let moves = d.matches('M').count();
        assert_eq!(moves, 2, "{d}");
        assert_eq!(d.matches('L').count(), 1, "{d}");
        // (0, 0) is the plot's bottom left; (3, 0.5) is its right edge,
        // halfway up.
        assert!(
            d.starts_with(&format!("M{LEFT:.1},{:.1}", H - BOTTOM)),
            "{d}"
        );
        let mid = (H - BOTTOM) - (H - TOP - BOTTOM) / 2.0;
        assert!(d.ends_with(&format!("M{:.1},{mid:.1}", W - RIGHT)), "{d}");
    }

    #[test]
    fn the_range_holds_the_data_the_thresholds_and_zero() {
        let s = [Series {
            name: "psi",
            points: vec![(0.0, Some(0.05)), (1.0, Some(f64::NAN)), (2.0, None)],
            style: Style::Solid(BLUE),
        }];
        let (lo, hi) = y_range(
            &s,
            &[Threshold {
                name: "act",
                y: 0.2,
            }],
        );
        assert_eq!(lo, 0.0);
        assert!(hi > 0.2 && hi < 0.25, "{hi}");
        // Nothing to draw: a unit range, not a division by zero.
        assert_eq!(y_range(&[], &[]), (0.0, 1.0));
        assert_eq!(x_range(&[], &[]), (0.0, 1.0));
    }

    #[test]
    fn the_chart_names_its_lines_and_thresholds_in_words() {
        let s = [Series {
            name: "PSI",
            points: vec![(0.0, Some(0.1)), (10.0, Some(0.3))],
            style: Style::Solid(BLUE),
        }];
        let m = line_chart(
            "pixels",
            &s,
            &[Threshold {
                name: "act 0.2",
                y: 0.2,
            }],
            &[Mark {
                x: 5.0,
                label: "retrain".into(),
            }],
            |x| format!("t{x}"),
        )
        .into_string();
        for want in [
            "<title>pixels</title>",
            "PSI",
            "act 0.2",
            "retrain",
            "t0",
            "t10",
        ] {
            assert!(m.contains(want), "{want} missing: {m}");
        }
    }
}
