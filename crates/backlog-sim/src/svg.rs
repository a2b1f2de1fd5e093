//! A self-contained SVG chart of a simulation: backlog, oldest age against the deadline, and
//! replicas against the partition cap, over time.

use std::fmt::Write as _;

use super::run::SimulationResult;
use backlog_core::format::{seconds, si};

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 170.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// A panel: its title, its lines, and how its axis values read.
type Panel<'a> = (&'a str, Vec<Series<'a>>, fn(f64) -> String);

pub fn render(result: &SimulationResult, partitions: u32) -> String {
    let rows = &result.timeline;
    let t_max = rows.last().map_or(1.0, |r| r.t).max(1.0);
    let series = |name, color, dashed, f: &dyn Fn(&super::run::TimelineRow) -> f64| Series {
        name,
        color,
        dashed,
        points: rows.iter().map(|r| (r.t, f(r))).collect(),
    };
    let panels: Vec<Panel> = vec![
        (
            "backlog (events)",
            vec![series("backlog", "#1f77b4", false, &|r| r.backlog)],
            si,
        ),
        (
            "oldest unfinished age vs deadline",
            vec![
                series("oldest age", "#d62728", false, &|r| r.oldest_age),
                series("deadline", "#555555", true, &|r| r.deadline),
            ],
            seconds,
        ),
        (
            "replicas",
            vec![
                series("spec.replicas", "#2ca02c", false, &|r| {
                    f64::from(r.replicas)
                }),
                series("ready", "#98df8a", false, &|r| f64::from(r.ready)),
                series("partitions", "#555555", true, &|_| f64::from(partitions)),
            ],
            |v| format!("{v:.0}"),
        ),
    ];
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{} — policy {}</text>"#,
        escape(&result.summary.scenario),
        result.summary.policy.name()
    );
    for (index, (title, lines, label)) in panels.iter().enumerate() {
        let top = TOP + index as f64 * (PANEL_HEIGHT + GAP) + 10.0;
        panel(&mut svg, top, t_max, title, lines, *label);
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(
    svg: &mut String,
    top: f64,
    t_max: f64,
    title: &str,
    lines: &[Series<'_>],
    label: fn(f64) -> String,
) {
    let plot_width = WIDTH - LEFT - RIGHT;
    let y_max = lines
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let x = |t: f64| LEFT + t / t_max * plot_width;
    let y = |v: f64| top + PANEL_HEIGHT - v / y_max * PANEL_HEIGHT;
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PANEL_HEIGHT}" fill="none" stroke="#cccccc"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
        top - 5.0,
        escape(title)
    );
    for tick in 0..=4 {
        let value = y_max * f64::from(tick) / 4.0;
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="end" fill="#444">{}</text>"##,
            LEFT - 5.0,
            y(value) + 4.0,
            label(value)
        );
        let t = t_max * f64::from(tick) / 4.0;
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#444">{}</text>"##,
            x(t),
            top + PANEL_HEIGHT + 14.0,
            seconds(t)
        );
    }
    let mut legend_x = LEFT + plot_width - 10.0;
    for series in lines.iter().rev() {
        let points = series
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect::<Vec<_>>()
            .join(" ");
        let dash = if series.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6"{dash} points="{points}"/>"#,
            series.color
        );
        let _ = writeln!(
            svg,
            r#"<text x="{legend_x}" y="{}" text-anchor="end" fill="{}">{}</text>"#,
            top - 5.0,
            series.color,
            escape(series.name)
        );
        legend_x -= 8.0 * series.name.len() as f64 + 14.0;
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
