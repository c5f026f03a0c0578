//! `plot.svg`: ok throughput (top panel) and ok latency on a log scale
//! (bottom panel) against seconds since the start, fault windows shaded
//! across both and labelled in lanes above.
//!
//! This module owns the drawing; it must never compute a series (that is
//! [`super::plot`]) nor judge the history.

use std::fmt::Write as _;

use super::plot::{Buckets, FaultWindow, buckets, fault_windows};
use super::secs;
use crate::checker::pair_operations_best_effort;
use crate::history::Event;

const SERIES_COLORS: [&str; 4] = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];
/// Width of the picture, px.
const W: f64 = 1100.0;
/// Left margin (the y axis labels), px.
const LEFT: f64 = 70.0;
/// Right margin (the legends), px.
const RIGHT: f64 = 150.0;
/// Width of a panel, px.
const PLOT_W: f64 = W - LEFT - RIGHT;
/// Height of a panel, px.
const PANEL_H: f64 = 220.0;
/// Height of one lane of fault labels, px.
const LANE_H: f64 = 14.0;

/// Where things go: the time span and the panels' tops.
struct Frame {
    span_ns: u64,
    /// Top of the throughput panel.
    top1: f64,
    /// Top of the latency panel.
    top2: f64,
    /// Width of a bucket, ns.
    width_ns: u64,
}

impl Frame {
    fn x_of(&self, ns: u64) -> f64 {
        LEFT + PLOT_W * (ns as f64 / self.span_ns as f64)
    }

    /// The x of the middle of bucket `i`.
    fn x_mid(&self, i: usize) -> f64 {
        self.x_of(((i as u64) * self.width_ns + self.width_ns / 2).min(self.span_ns))
    }
}

/// `plot.svg`: ok throughput per second (top) and ok latency p50/max in ms
/// on a log scale (bottom), against seconds since the start, with the fault
/// windows shaded and labelled.
pub fn render_svg(events: &[Event]) -> String {
    // Best effort: a history the checker rejects still gets a plot of what pairs.
    let ops = pair_operations_best_effort(events);
    let span_ns = events.iter().map(|e| e.time).max().unwrap_or(0).max(1);
    let b = buckets(events, &ops, span_ns);
    let windows = fault_windows(events);
    let (lanes, lane_count) = label_lanes(&windows, span_ns);
    let label_h = LANE_H * lane_count.max(1) as f64 + 6.0;
    let top1 = 40.0 + label_h;
    let top2 = top1 + PANEL_H + 50.0;
    let height = top2 + PANEL_H + 50.0;
    let frame = Frame {
        span_ns,
        top1,
        top2,
        width_ns: b.width_ns,
    };

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14">ringraft-jepsen: throughput and latency of ok operations (buckets of {} ms), fault windows shaded</text>"#,
        b.width_ns / 1_000_000
    );
    draw_fault_windows(&mut s, &frame, &windows, &lanes);
    draw_throughput(&mut s, &frame, &b);
    draw_latency(&mut s, &frame, &b);
    s.push_str("</svg>\n");
    s
}

/// Lanes for the fault labels, greedy, so that overlapping windows stack:
/// each window's lane, and the number of lanes.
fn label_lanes(windows: &[FaultWindow], span_ns: u64) -> (Vec<usize>, usize) {
    let mut lane_end: Vec<u64> = Vec::new();
    let mut lanes = Vec::with_capacity(windows.len());
    for w in windows {
        let end = w.end.max(w.start + span_ns / 50);
        let lane = lane_end
            .iter()
            .position(|&e| e <= w.start)
            .unwrap_or(lane_end.len());
        if lane == lane_end.len() {
            lane_end.push(end);
        } else {
            lane_end[lane] = end;
        }
        lanes.push(lane);
    }
    (lanes, lane_end.len())
}

/// Fault windows: shading across both panels, labels in lanes above.
fn draw_fault_windows(s: &mut String, frame: &Frame, windows: &[FaultWindow], lanes: &[usize]) {
    for (w, &lane) in windows.iter().zip(lanes) {
        let x0 = frame.x_of(w.start);
        let x1 = frame.x_of(w.end).max(x0 + 1.5);
        let color = fault_color(&w.fault);
        let title = svg_escape(&format!(
            "{} {} from {:.3} s to {:.3} s",
            w.fault,
            w.targets,
            secs(w.start),
            secs(w.end)
        ));
        for (top, h) in [(frame.top1, PANEL_H), (frame.top2, PANEL_H)] {
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{h}" fill="{color}" fill-opacity="{}"><title>{title}</title></rect>"#,
                x1 - x0,
                if w.instant { 0.9 } else { 0.35 }
            );
        }
        let y = 34.0 + LANE_H * lane as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{}" fill="{color}"><title>{title}</title></rect>"#,
            y - 10.0,
            x1 - x0,
            LANE_H - 2.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{y:.1}" font-size="10">{}</text>"#,
            x0 + 2.0,
            svg_escape(&w.fault)
        );
    }
}

/// A y-axis tick label and its grid line.
fn y_tick(s: &mut String, y: f64, v: f64) {
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
        LEFT - 4.0,
        y + 4.0,
        fmt_num(v)
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/>"##,
        LEFT + PLOT_W
    );
}

/// Top panel: ok operations per second by f, failed+unknown per second.
fn draw_throughput(s: &mut String, frame: &Frame, b: &Buckets) {
    let top1 = frame.top1;
    let mut max_rate: f64 = b.bad_rate.iter().copied().fold(1.0, f64::max);
    for series in b.ok_rate.values() {
        max_rate = series.iter().copied().fold(max_rate, f64::max);
    }
    let rate_top = nice_ceiling(max_rate);
    axes(s, top1, PANEL_H, PLOT_W, LEFT, frame.span_ns, "ok ops/s");
    for i in 0..=4 {
        let v = rate_top * i as f64 / 4.0;
        let y = top1 + PANEL_H - PANEL_H * i as f64 / 4.0;
        y_tick(s, y, v);
    }
    let rate_y = |v: f64| top1 + PANEL_H - PANEL_H * (v / rate_top);
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    for (k, (f, series)) in b.ok_rate.iter().enumerate() {
        let color = SERIES_COLORS[k % SERIES_COLORS.len()];
        polyline(
            s,
            (0..b.count).map(|i| Some((frame.x_mid(i), rate_y(series[i])))),
            color,
            false,
        );
        legend.push((format!("{f} ok/s"), color, false));
    }
    if b.bad_rate.iter().any(|&v| v > 0.0) {
        polyline(
            s,
            (0..b.count).map(|i| Some((frame.x_mid(i), rate_y(b.bad_rate[i])))),
            "#d62728",
            false,
        );
        legend.push(("fail+info/s".into(), "#d62728", false));
    }
    draw_legend(s, &legend, LEFT + PLOT_W + 10.0, top1 + 10.0);
}

/// Bottom panel: latency p50 and max of ok operations by f, log scale.
fn draw_latency(s: &mut String, frame: &Frame, b: &Buckets) {
    let top2 = frame.top2;
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for series in b.latency_ms.values() {
        for (p50, max) in series.iter().flatten() {
            lo = lo.min(*p50);
            hi = hi.max(*max);
        }
    }
    if hi <= 0.0 {
        (lo, hi) = (0.1, 10.0);
    }
    let decade_lo = lo.max(1e-3).log10().floor() as i32;
    let decade_hi = (hi.log10().ceil() as i32).max(decade_lo + 1);
    axes(
        s,
        top2,
        PANEL_H,
        PLOT_W,
        LEFT,
        frame.span_ns,
        "latency ms (log)",
    );
    let lat_y = |v: f64| {
        let t = (v.max(1e-3).log10() - decade_lo as f64) / (decade_hi - decade_lo) as f64;
        top2 + PANEL_H - PANEL_H * t
    };
    for d in decade_lo..=decade_hi {
        let v = 10f64.powi(d);
        y_tick(s, lat_y(v), v);
    }
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    for (k, (f, series)) in b.latency_ms.iter().enumerate() {
        let color = SERIES_COLORS[k % SERIES_COLORS.len()];
        polyline(
            s,
            series
                .iter()
                .enumerate()
                .map(|(i, v)| v.map(|(p50, _)| (frame.x_mid(i), lat_y(p50)))),
            color,
            false,
        );
        polyline(
            s,
            series
                .iter()
                .enumerate()
                .map(|(i, v)| v.map(|(_, max)| (frame.x_mid(i), lat_y(max)))),
            color,
            true,
        );
        legend.push((format!("{f} p50"), color, false));
        legend.push((format!("{f} max"), color, true));
    }
    draw_legend(s, &legend, LEFT + PLOT_W + 10.0, top2 + 10.0);
}

fn svg_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fault_color(fault: &str) -> &'static str {
    match fault {
        f if f.starts_with("partition") => "#f4a582",
        "kill" | "restart" => "#d6604d",
        "pause" | "resume" => "#92c5de",
        "corrupt" | "truncate" => "#b2abd2",
        "membership" => "#a6dba0",
        "transfer" => "#fddbc7",
        _ => "#cccccc",
    }
}

/// A panel's frame, its y label, and the time axis below it.
fn axes(s: &mut String, top: f64, h: f64, w: f64, left: f64, span_ns: u64, label: &str) {
    let bottom = top + h;
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"##,
        top + h / 2.0,
        top + h / 2.0,
        svg_escape(label)
    );
    let span_s = secs(span_ns);
    let step = nice_ceiling(span_s / 10.0);
    let mut t = 0.0;
    while t <= span_s + 1e-9 {
        let x = left + w * (t / span_s);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{bottom}" y2="{:.1}" stroke="#444"/>"##,
            bottom + 4.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            bottom + 16.0,
            fmt_num(t)
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text>"##,
        left + w / 2.0,
        bottom + 32.0
    );
}

fn polyline(
    s: &mut String,
    points: impl Iterator<Item = Option<(f64, f64)>>,
    color: &str,
    dashed: bool,
) {
    // Break the line where a bucket has no data.
    let mut segment: Vec<String> = Vec::new();
    let dash = if dashed {
        r#" stroke-dasharray="4 3""#
    } else {
        ""
    };
    let flush = |segment: &mut Vec<String>, s: &mut String| {
        if segment.len() == 1 {
            let xy: Vec<&str> = segment[0].split(',').collect();
            let _ = writeln!(
                s,
                r#"<circle cx="{}" cy="{}" r="1.8" fill="{color}"/>"#,
                xy[0], xy[1]
            );
        } else if segment.len() > 1 {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{}"/>"#,
                segment.join(" ")
            );
        }
        segment.clear();
    };
    for p in points {
        match p {
            Some((x, y)) => segment.push(format!("{x:.1},{y:.1}")),
            None => flush(&mut segment, s),
        }
    }
    flush(&mut segment, s);
}

fn draw_legend(s: &mut String, items: &[(String, &str, bool)], x: f64, y: f64) {
    for (i, (label, color, dashed)) in items.iter().enumerate() {
        let yy = y + 16.0 * i as f64;
        let dash = if *dashed {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
            x + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 24.0,
            yy + 4.0,
            svg_escape(label)
        );
    }
}

/// 1, 2, 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v - 1e-12 {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::history::{EventType, Phase};

    #[test]
    fn svg_has_both_panels_and_the_windows() {
        let mut events = vec![Event::nemesis(
            1_000_000_000,
            "partition",
            json!("x<y"),
            Some(Phase::Start),
        )];
        for i in 0..50u64 {
            let t = i * 100_000_000;
            events.push(Event::append_invoke(t, i, format!("v{i}")));
            events.push(Event::append_completion(
                t + 3_000_000,
                i,
                EventType::Ok,
                format!("v{i}"),
                Some(i + 1),
            ));
        }
        events.push(Event::nemesis(
            3_000_000_000,
            "partition",
            json!("x<y"),
            Some(Phase::Stop),
        ));
        events.sort_by_key(|e| e.time);
        let svg = render_svg(&events);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("ok ops/s") && svg.contains("latency ms (log)"));
        assert!(
            svg.contains("partition &quot;x&lt;y&quot; from 1.000 s to 3.000 s"),
            "{svg}"
        );
        assert!(svg.contains("append p50") && svg.contains("append max"));
    }

    #[test]
    fn nice_ceiling_rounds_up() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(10.0), 10.0);
        assert_eq!(nice_ceiling(11.0), 20.0);
        assert_eq!(nice_ceiling(0.03), 0.05);
    }
}
