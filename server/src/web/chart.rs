//! Charts drawn as inline SVG on the server: no script, no assets from elsewhere. Every text
//! that reaches the SVG is escaped here.

use std::fmt::Write;

/// Colours for series, in order (readable on white, told apart by most colour-blind readers).
pub(crate) const PALETTE: [&str; 8] = [
    "#1f77b4", "#e66100", "#2ca02c", "#9467bd", "#8c564b", "#d62728", "#17becf", "#7f7f7f",
];

const W: f64 = 640.0;
const H: f64 = 240.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// One point of a line.
pub(crate) struct Point {
    pub x: f64,
    pub y: f64,
    /// Drawn as a hollow red ring: a commit with lossy tensors.
    pub marked: bool,
    /// Where clicking the point goes.
    pub href: String,
    /// Its tooltip.
    pub label: String,
}

/// A named line.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

/// Escapes text for SVG and HTML.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Bounds of a set of values, widened when they are all equal.
fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
            (l.min(v), h.max(v))
        });
    if lo > hi {
        return None;
    }
    if lo == hi {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.05 };
        return Some((lo - pad, hi + pad));
    }
    Some((lo, hi))
}

/// A number short enough for an axis label.
pub(crate) fn short_number(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{v:.2e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

struct Frame {
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x.0) / (self.x.1 - self.x.0) * (W - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - (y - self.y.0) / (self.y.1 - self.y.0) * (H - TOP - BOTTOM)
    }

    /// The SVG's opening, axes and the four corner labels.
    fn open(&self, svg: &mut String, title: &str, x_label: &str, y_text: impl Fn(f64) -> String) {
        let _ = write!(
            svg,
            r#"<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="{t}"><title>{t}</title>"#,
            t = esc(title)
        );
        let (x0, x1, y0, y1) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
        let _ = write!(
            svg,
            r##"<path d="M{x0} {y0}V{y1}H{x1}" fill="none" stroke="#888"/>"##
        );
        for (y, v) in [(y0, self.y.1), (y1, self.y.0)] {
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end" class="tick">{}</text>"#,
                LEFT - 4.0,
                y + 4.0,
                esc(&y_text(v))
            );
        }
        for (x, v, anchor) in [(x0, self.x.0, "start"), (x1, self.x.1, "end")] {
            let _ = write!(
                svg,
                r#"<text x="{x}" y="{}" text-anchor="{anchor}" class="tick">{}</text>"#,
                H - 10.0,
                esc(&short_number(v))
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
            (x0 + x1) / 2.0,
            H - 10.0,
            esc(x_label)
        );
    }
}

/// A line chart of `series` against a shared x axis; `None` when no point is finite.
pub(crate) fn lines(title: &str, x_label: &str, series: &[Series]) -> Option<String> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let frame = Frame {
        x: bounds(all().map(|p| p.x))?,
        y: bounds(all().map(|p| p.y))?,
    };
    let mut svg = String::new();
    frame.open(&mut svg, title, x_label, short_number);
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let finite: Vec<&Point> = s
            .points
            .iter()
            .filter(|p| p.x.is_finite() && p.y.is_finite())
            .collect();
        let path: Vec<String> = finite
            .iter()
            .map(|p| format!("{:.1},{:.1}", frame.px(p.x), frame.py(p.y)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline class="series" data-series="{}" points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            esc(&s.name),
            path.join(" ")
        );
        for p in finite {
            let (x, y) = (frame.px(p.x), frame.py(p.y));
            let dot = if p.marked {
                format!(
                    r##"<circle class="lossy" cx="{x:.1}" cy="{y:.1}" r="4" fill="white" stroke="#d62728" stroke-width="2"/>"##
                )
            } else {
                format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{colour}"/>"#)
            };
            let _ = write!(
                svg,
                r#"<a href="{}"><title>{}</title>{dot}</a>"#,
                esc(&p.href),
                esc(&p.label)
            );
        }
    }
    svg.push_str("</svg>");
    Some(svg)
}

/// Stacked areas: `layers[k][i]` is layer k's value at `x[i]`; the top edge is their sum.
pub(crate) fn stacked(
    title: &str,
    x_label: &str,
    x: &[f64],
    layers: &[(&str, Vec<f64>)],
    y_text: impl Fn(f64) -> String,
) -> Option<String> {
    let top: Vec<f64> = (0..x.len())
        .map(|i| layers.iter().map(|(_, v)| v[i]).sum())
        .collect();
    let frame = Frame {
        x: bounds(x.iter().copied())?,
        y: (0.0, bounds(top.iter().copied())?.1.max(1.0)),
    };
    let mut svg = String::new();
    frame.open(&mut svg, title, x_label, y_text);
    let mut below = vec![0.0; x.len()];
    for (k, (name, values)) in layers.iter().enumerate() {
        let above: Vec<f64> = below.iter().zip(values).map(|(b, v)| b + v).collect();
        let mut d = String::new();
        for (i, xi) in x.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1} {:.1}",
                if i == 0 { "M" } else { "L" },
                frame.px(*xi),
                frame.py(above[i])
            );
        }
        for (i, xi) in x.iter().enumerate().rev() {
            let _ = write!(d, "L{:.1} {:.1}", frame.px(*xi), frame.py(below[i]));
        }
        let _ = write!(
            svg,
            r#"<path class="layer" data-layer="{}" d="{d}Z" fill="{}" fill-opacity="0.75"><title>{}</title></path>"#,
            esc(name),
            PALETTE[k % PALETTE.len()],
            esc(name)
        );
        below = above;
    }
    svg.push_str("</svg>");
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_empty_data_draws_nothing() {
        let s = Series {
            name: "<b>\"x\"".into(),
            points: vec![Point {
                x: 1.0,
                y: 2.0,
                marked: true,
                href: "/a?b=1&c=2".into(),
                label: "<script>".into(),
            }],
        };
        let svg = lines("t", "step", &[s]).unwrap();
        assert!(!svg.contains("<script>") && !svg.contains("<b>"));
        assert!(svg.contains("&lt;script&gt;") && svg.contains("b=1&amp;c=2"));
        assert!(svg.contains(r#"class="lossy""#));
        assert!(lines("t", "step", &[]).is_none());
        let nan = Series {
            name: "n".into(),
            points: vec![Point {
                x: 0.0,
                y: f64::NAN,
                marked: false,
                href: String::new(),
                label: String::new(),
            }],
        };
        assert!(lines("t", "step", &[nan]).is_none());
    }

    #[test]
    fn axis_numbers_stay_short() {
        assert_eq!(short_number(2.5), "2.5");
        assert_eq!(short_number(1234.0), "1234");
        assert_eq!(short_number(0.00001), "1.00e-5");
        assert_eq!(short_number(0.0), "0");
    }
}
