//! The HTML report: renders a [`Report`] into one self-contained page (inline CSS, plots as
//! inline SVG drawn here, no scripts, no external URLs). This module owns presentation only: it
//! measures nothing and derives nothing beyond what a plot needs (scales, ticks, per-second
//! rates from bucket counts), so the page always agrees with `report.json`.
//!
//! Every string taken from the report is HTML-escaped. Missing, empty or non-finite data shows
//! as "no data" (or "–" in a table cell); rendering never panics.

use std::fmt::{Result, Write};

use chrono::{DateTime, SecondsFormat, Utc};

use super::{Bucket, Event, Histogram, Percentiles, Report};

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1100px;\
color:#222;padding:0 16px}h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ddd;\
margin-top:28px}h3{font-size:14px;margin:12px 0 4px}table{border-collapse:collapse;margin:6px 0}\
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}\
th{background:#f4f4f4}caption{font-weight:bold;text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}.bad{color:#c62828;font-weight:bold}\
.pill{padding:1px 8px;border-radius:9px;color:#fff;white-space:nowrap;font-weight:normal}\
.pill.ok{background:#2e7d32}.pill.bad{background:#c62828}.pill.na{background:#888}\
.nodata{color:#888;font-style:italic}.grid{display:flex;flex-wrap:wrap;gap:16px;\
align-items:flex-start}svg{width:100%;max-width:900px;height:auto;display:block}\
pre{background:#f7f7f7;padding:8px;overflow:auto}svg text{font:11px sans-serif}\
svg .evt{fill:#555;font-size:10px;paint-order:stroke;stroke:#fff;stroke-width:3px}\
svg .end{text-anchor:end}svg .mid{text-anchor:middle}svg .bg{fill:#fafafa}\
svg .gl{stroke:#e4e4e4}svg .ax{stroke:#333;fill:none}svg .ev{stroke:#555;stroke-dasharray:4 3}\
svg .bar{fill:#4c78a8}svg polyline{fill:none}";

const NO_DATA: &str = "<p class=\"nodata\">no data</p>\n";
const DASH: &str = "–";
const MIB: f64 = 1024.0 * 1024.0;

/// The self-contained HTML report of a run: no scripts or styles fetched from anywhere.
pub fn render(report: &Report) -> String {
    let mut out = String::with_capacity(64 * 1024);
    // Writing into a String cannot fail.
    let _ = page(&mut out, report);
    out
}

fn page(o: &mut String, r: &Report) -> Result {
    let (scenario, run_id) = (esc(&r.scenario), esc(&r.run_id));
    let title = format!("chronoshard load test: {scenario} ({run_id})");
    *o += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
    writeln!(o, "<title>{title}</title><style>{CSS}</style>")?;
    writeln!(o, "</head><body>\n<h1>{title}</h1>")?;
    header(o, r)?;
    targets(o, r)?;
    if !r.warnings.is_empty() {
        h2(o, "Warnings")?;
        list(o, &r.warnings)?;
    }
    summary(o, r)?;
    growth(o, r)?;
    correctness(o, r)?;
    h2(o, "Ratios to raw JetStream")?;
    let rows = r.ratios.iter().map(|x| {
        let (platform, raw) = (compact(x.platform), compact(x.raw));
        vec![esc(&x.what), platform, raw, compact(x.ratio)]
    });
    table(o, "what|platform|raw|ratio", rows.collect())?;
    plots(o, r)?;
    h2(o, "Processes")?;
    let mib = |b: u64| num(b as f64 / MIB, 1);
    let rows = r.processes.iter().map(|p| {
        let (cpu, cores) = (num(p.cpu_s, 2), num(p.cpu_cores, 2));
        let (peak, hwm) = (mib(p.peak_rss_bytes), mib(p.hwm_rss_bytes));
        vec![esc(&p.name), p.pid.to_string(), cpu, cores, peak, hwm]
    });
    let head = "name|pid|cpu s|cpu cores|peak RSS MiB|RSS high-water MiB";
    table(o, head, rows.collect())?;
    h2(o, "Events")?;
    let rows = r.events.iter().map(|e| vec![num(e.t_s, 1), esc(&e.what)]);
    table(o, "t (s)|what", rows.collect())?;
    writeln!(o, "</body></html>")
}

fn header(o: &mut String, r: &Report) -> Result {
    let secs = (r.finished_at - r.started_at).num_milliseconds() as f64 / 1000.0;
    let (m, p) = (&r.machine, &r.platform);
    let load = format!("{} → {}", num(m.load_start, 2), num(m.load_end, 2));
    let memory = format!("{} GiB", num(m.memory_bytes as f64 / MIB / 1024.0, 1));
    let spawned = if p.spawned { "yes" } else { "no" };
    let run = [
        ("scenario", esc(&r.scenario)),
        ("run id", esc(&r.run_id)),
        ("started", time(r.started_at)),
        ("finished", time(r.finished_at)),
        ("duration", format!("{} s", num(secs, 1))),
        ("report version", r.version.to_string()),
    ];
    let machine = [
        ("host", esc(&m.hostname)),
        ("cpus", m.cpus.to_string()),
        ("cpu model", esc(&m.cpu_model)),
        ("memory", memory),
        ("kernel", esc(&m.kernel)),
        ("load average (1 min), start → end", load),
        (
            "a thread wake-up round trip",
            esc(&m.wake.describe().unwrap_or_else(|| "not measured".into())),
        ),
    ];
    let platform = [
        ("platform url", esc(&p.url)),
        ("nats url", esc(&p.nats_url)),
        ("nats version", esc(&p.nats_version)),
        ("chronoshard version", esc(&p.chronoshard_version)),
        ("spawned by this run", spawned.to_string()),
        ("shard nodes", p.shard_nodes.to_string()),
        ("workers", p.workers.to_string()),
    ];
    *o += "<div class=\"grid\">";
    kv(o, "Run", &run)?;
    kv(o, "Machine", &machine)?;
    kv(o, "Platform", &platform)?;
    *o += "</div>\n";
    if !r.params.is_null() {
        let params = esc(&serde_json::to_string_pretty(&r.params).unwrap_or_default());
        *o += "<details><summary>scenario parameters</summary>";
        writeln!(o, "<pre>{params}</pre></details>")?;
    }
    Ok(())
}

fn targets(o: &mut String, r: &Report) -> Result {
    h2(o, "Targets")?;
    let rows = r.targets.iter().map(|t| {
        let met = match t.met {
            Some(true) => "<span class=\"pill ok\">met</span>",
            Some(false) => "<span class=\"pill bad\">not met</span>",
            None => "<span class=\"pill na\">not judged</span>",
        };
        let (what, target) = (esc(&t.what), esc(&t.target));
        vec![what, target, esc(&t.measured), met.to_string()]
    });
    table(o, "what|target|measured|met", rows.collect())
}

/// One row of the summary table; without percentiles, their columns show dashes.
fn row(name: &str, n: u64, per_s: f64, p: Option<&Percentiles>, details: String) -> Vec<String> {
    let pcts = p.map(|p| [p.p50, p.p90, p.p99, p.p999, p.max].map(ms));
    let mut row = vec![name.to_string(), n.to_string(), rate(per_s)];
    row.extend(pcts.unwrap_or_else(|| [(); 5].map(|_| DASH.to_string())));
    row.push(details);
    row
}

fn summary(o: &mut String, r: &Report) -> Result {
    h2(o, "Summary")?;
    let target = |t: f64| match t > 0.0 {
        true => format!("target {}/s", rate(t)),
        false => "unthrottled".to_string(),
    };
    let mut rows = Vec::new();
    if let Some(c) = &r.create {
        let (failed, target) = (flag(c.failed > 0, c.failed), target(c.target_per_s));
        let details = format!(
            "requested {}, failed {failed}, retried {}, {target}",
            c.requested, c.retried
        );
        let (name, lat) = ("create (request latency)", Some(&c.latency_ms));
        rows.push(row(name, c.created, c.achieved_per_s, lat, details));
    }
    for (name, phase) in [("fire (lateness)", &r.fire), ("start (lateness)", &r.start)] {
        if let Some(s) = phase {
            let lat = Some(&s.lateness_ms);
            rows.push(row(name, s.count, s.per_s, lat, String::new()));
        }
    }
    if let Some(f) = &r.fairness {
        let big = format!("tenant {}", esc(&f.big_tenant));
        for (name, p, who) in [
            ("fire: the big tenant", &f.big, big),
            ("fire: the other tenants", &f.others, String::new()),
        ] {
            rows.push(row(name, p.count, 0.0, Some(p), who));
        }
    }
    if let Some(e) = &r.end_to_end {
        let (name, window) = ("end to end (completed)", num(e.window_s, 1));
        let mut details = format!("window {window} s");
        if let Some(cpu) = super::text::cpu_line(&e.cpu_us_per_job) {
            details += &format!("; CPU per job {}", esc(&cpu));
        }
        rows.push(row(name, e.completed, e.per_s, None, details));
    }
    if let Some(x) = &r.raw {
        let (name, rt) = ("raw JetStream (round trip)", Some(&x.round_trip_ms));
        let mut details = target(x.target_per_s);
        if let Some(cpu) = super::text::cpu_line(&x.cpu_us_per_round_trip) {
            details += &format!("; CPU per round trip {}", esc(&cpu));
        }
        rows.push(row(name, x.count, x.per_s, rt, details));
    }
    let head = "figure|count|per s|p50 ms|p90 ms|p99 ms|p99.9 ms|max ms|details";
    table(o, head, rows)?;
    if !r.server.is_empty() {
        *o += "<h3>The platform's own histograms (its /metrics, over this run)</h3>";
        list(
            o,
            &r.server
                .iter()
                .map(super::text::server_line)
                .collect::<Vec<_>>(),
        )?;
    }
    if let Some(c) = r.create.as_ref().filter(|c| !c.errors.is_empty()) {
        *o += "<h3>Create errors (first few)</h3>";
        list(o, &c.errors)?;
    }
    Ok(())
}

/// `grow`: the growth's times and the figures of each phase (nothing for other scenarios).
fn growth(o: &mut String, r: &Report) -> Result {
    let Some(g) = &r.growth else {
        return Ok(());
    };
    h2(o, "Adding shards")?;
    let secs = |v: Option<f64>| v.map_or(DASH.to_string(), |v| format!("{} s", num(v, 2)));
    let after = g.shards_after.map_or(DASH.to_string(), |n| n.to_string());
    let rows = [
        (
            "shards",
            format!("{} + {} → {after}", g.shards_from, g.shards_added),
        ),
        ("POST /v1/shards at", secs(Some(g.started_s))),
        ("growth done at", flag(g.ended_s.is_none(), secs(g.ended_s))),
        ("growth took", secs(g.duration_s)),
        ("tenants moved", g.tenants_moved.to_string()),
        (
            "node joined",
            format!("{} at {}", esc(&g.node), secs(g.node_joined_s)),
        ),
        ("… owned shards at", secs(g.node_owned_shards_s)),
    ];
    kv(o, "Growth (times since the run's start)", &rows)?;
    let rows = g.phases.iter().map(|p| {
        let l = &p.fire.lateness_ms;
        let mut row = vec![esc(&p.name), secs(p.from_s), secs(p.to_s)];
        row.extend([p.fire.count.to_string(), rate(p.fire.per_s)]);
        row.extend([l.p50, l.p99, l.p999, l.max].map(ms));
        row.extend([p.start.count.to_string(), rate(p.start.per_s)]);
        row
    });
    let head =
        "phase|from|to|fires|fires/s|fire p50 ms|p99 ms|p99.9 ms|max ms|executions|executions/s";
    table(o, head, rows.collect())
}

fn correctness(o: &mut String, r: &Report) -> Result {
    h2(o, "Correctness")?;
    let Some(c) = &r.correctness else {
        *o += NO_DATA;
        return Ok(());
    };
    let (twice, two) = (c.tickets_executed_twice, c.occurrences_with_two_tickets);
    let after_death = c.executed_twice_after_worker_death;
    let unexplained = twice.saturating_sub(after_death);
    let bad = flag(unexplained > 0, unexplained);
    let rows = [
        ("expected occurrences", c.expected.to_string()),
        ("fired (ticket published)", c.fired.to_string()),
        ("executed", c.executed.to_string()),
        ("missed", flag(c.missed > 0, c.missed)),
        (
            "reported missed/skipped",
            flag(c.reported_not_fired > 0, c.reported_not_fired),
        ),
        ("occurrences with two tickets", flag(two > 0, two)),
        (
            "occurrences executed twice",
            c.occurrences_executed_twice.to_string(),
        ),
        ("tickets executed twice", twice.to_string()),
        ("… after their worker died", after_death.to_string()),
        ("… without a worker death", bad),
    ];
    kv(o, "Occurrences", &rows)?;
    if !c.examples.is_empty() {
        *o += "<h3>Examples</h3>";
        list(o, &c.examples)?;
    }
    Ok(())
}

// ---- SVG plots -------------------------------------------------------------------------------

/// `(name, colour, points)`; a point's missing or non-finite `y` breaks the line there.
type Series<'a> = (&'a str, &'a str, Vec<(f64, Option<f64>)>);

/// Reads one series' value out of a bucket.
type Read<T> = fn(&Bucket) -> T;

const LATENESS: [(&str, &str, Read<Option<f64>>); 4] = [
    ("fire p50", "#1f77b4", |b| b.fire_p50_ms),
    ("fire p99", "#ff7f0e", |b| b.fire_p99_ms),
    ("fire max", "#d62728", |b| b.fire_max_ms),
    ("start p99", "#2ca02c", |b| b.start_p99_ms),
];
const THROUGHPUT: [(&str, &str, Read<u64>); 4] = [
    ("created", "#7f7f7f", |b| b.created),
    ("fired", "#1f77b4", |b| b.fired),
    ("started", "#2ca02c", |b| b.started),
    ("completed", "#9467bd", |b| b.completed),
];

fn plots(o: &mut String, r: &Report) -> Result {
    let (b, ev) = (&r.timeline.buckets, &r.events);
    h2(o, "Lateness over time")?;
    let points = |f: Read<Option<f64>>| b.iter().map(|x| (x.t_s, f(x))).collect();
    let lateness = LATENESS.map(|(name, color, f)| (name, color, points(f)));
    chart(o, "lateness (ms)", &lateness, ev, true)?;
    h2(o, "Throughput over time")?;
    let (bucket_ms, secs) = (r.timeline.bucket_ms, r.timeline.bucket_ms as f64 / 1000.0);
    if secs > 0.0 {
        let per_s = |f: Read<u64>| b.iter().map(move |x| f(x) as f64 / secs);
        let points = |f| b.iter().map(|x| x.t_s).zip(per_s(f).map(Some)).collect();
        let throughput = THROUGHPUT.map(|(name, color, f)| (name, color, points(f)));
        chart(o, "per second", &throughput, ev, false)?;
        writeln!(o, "<p>Buckets of {bucket_ms} ms.</p>")?;
    } else {
        *o += NO_DATA;
    }
    h2(o, "Lateness histograms")?;
    let (fire, start) = (r.fire_histogram.as_ref(), r.start_histogram.as_ref());
    histogram(o, "Fire lateness (scheduled → ticket published)", fire)?;
    histogram(o, "Start lateness (scheduled → executor start)", start)
}

const W: f64 = 860.0;
const H: f64 = 320.0;
const ML: f64 = 64.0;
const MT: f64 = 28.0;
const PW: f64 = W - ML - 16.0;
const PH: f64 = H - MT - 46.0;
const BOTTOM: f64 = MT + PH;

/// A scale: `lo`/`hi` are in plot space (log10 of the value when `log`).
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<(f64, String)>,
}

impl Axis {
    /// "Nice" bounds and ticks (1, 2 or 5 × 10ⁿ apart) covering `lo..=hi`.
    fn linear(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = match (lo, hi) {
            (l, h) if (h - l).is_finite() && h > l => (l, h),
            (l, _) if l.is_finite() && l != 0.0 => (l - l.abs() / 10.0, l + l.abs() / 10.0),
            _ => (0.0, 1.0),
        };
        let raw = (hi - lo) / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let nice = [1.0, 2.0, 5.0].into_iter().find(|m| raw / mag <= *m);
        let step = mag * nice.unwrap_or(10.0);
        if !step.is_normal() || !(hi - lo).is_finite() {
            return Axis::linear(0.0, 1.0);
        }
        let (lo, hi, log) = ((lo / step).floor() * step, (hi / step).ceil() * step, false);
        let ticks = (0..=20).map(|i| lo + step * f64::from(i));
        let ticks = ticks.take_while(|t| *t <= hi + step * 1e-6);
        let ticks = ticks.map(|t| (t, tick_label(t, step))).collect();
        Axis { lo, hi, log, ticks }
    }

    /// Decades covering `min..=max`; `min` > 0 and `max` finite.
    fn log(min: f64, max: f64) -> Axis {
        let lo = min.log10().floor();
        let (hi, log) = (max.log10().ceil().max(lo + 1.0), true);
        let every = ((hi - lo) / 8.0).ceil().max(1.0);
        let decades = (0..=40).map(|i| lo + every * f64::from(i));
        let decades = decades.take_while(|e| *e <= hi);
        let values = decades.map(|e| 10f64.powf(e));
        let ticks = values.map(|v| (v, compact(v))).collect();
        Axis { lo, hi, log, ticks }
    }

    /// Where `v` falls, 0.0 (low end) to 1.0 (high end); out-of-range values are clamped.
    fn pos(&self, v: f64) -> f64 {
        let v = match (self.log, v > 0.0) {
            (false, _) => v,
            (true, true) => v.log10(),
            (true, false) => self.lo,
        };
        ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    fn x(&self, v: f64) -> f64 {
        ML + self.pos(v) * PW
    }

    fn y(&self, v: f64) -> f64 {
        BOTTOM - self.pos(v) * PH
    }
}

fn line(o: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), class: &str) -> Result {
    let (x1, y1, x2, y2) = (r1(x1), r1(y1), r1(x2), r1(y2));
    write!(o, r#"<line class="{class}" x1="{x1}" y1="{y1}""#)?;
    write!(o, r#" x2="{x2}" y2="{y2}"/>"#)
}

/// Text at `(x, y)`, turned by `deg` degrees around that point; `body` must be escaped already.
fn text(o: &mut String, (x, y): (f64, f64), deg: i32, class: &str, body: &str) -> Result {
    let (x, y) = (r1(x), r1(y));
    write!(o, r#"<text class="{class}" x="{x}" y="{y}""#)?;
    write!(o, r#" transform="rotate({deg} {x} {y})">{body}</text>"#)
}

/// Opens the `<svg>` and draws the plot area, the y axis with grid and ticks, and both titles.
fn svg_open(o: &mut String, y: &Axis, x_title: &str, y_title: &str) -> Result {
    let right = ML + PW;
    write!(o, r#"<svg viewBox="0 0 {W} {H}" role="img">"#)?;
    write!(o, r#"<rect class="bg" x="{ML}" y="{MT}""#)?;
    write!(o, r#" width="{PW}" height="{PH}"/>"#)?;
    for (v, label) in &y.ticks {
        line(o, (ML, y.y(*v)), (right, y.y(*v)), "gl")?;
        text(o, (ML - 6.0, y.y(*v) + 4.0), 0, "end", label)?;
    }
    write!(o, r#"<path class="ax" d="M{ML} {MT}V{BOTTOM}H{right}"/>"#)?;
    text(o, (ML + PW / 2.0, H - 6.0), 0, "mid", &esc(x_title))?;
    text(o, (14.0, MT + PH / 2.0), -90, "mid", &esc(y_title))
}

fn finite(p: &(f64, Option<f64>)) -> Option<(f64, f64)> {
    match *p {
        (x, Some(y)) if x.is_finite() && y.is_finite() => Some((x, y)),
        _ => None,
    }
}

fn bounds(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (inf, neg) = (f64::INFINITY, f64::NEG_INFINITY);
    vals.fold((inf, neg), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// Draws one run of consecutive points (a dot when it is a single point) and empties it.
fn flush(o: &mut String, run: &mut Vec<String>, color: &str) -> Result {
    match run.as_slice() {
        [] => {}
        [p] => {
            let (x, y) = p.split_once(',').unwrap_or_default();
            write!(o, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>"#)?;
        }
        pts => {
            let pts = pts.join(" ");
            write!(o, r#"<polyline points="{pts}" stroke="{color}"/>"#)?;
        }
    }
    run.clear();
    Ok(())
}

/// A chart over time: one line per series, a dashed labelled line per event, a legend when
/// there are several series. The y axis is logarithmic when `log_ok`, the values are ≥ 0 and
/// the positive ones span two decades or more; else linear from 0 with nice ticks.
fn chart(o: &mut String, y_title: &str, series: &[Series], ev: &[Event], log_ok: bool) -> Result {
    let pts = series.iter().flat_map(|s| s.2.iter().filter_map(finite));
    let pts: Vec<(f64, f64)> = pts.collect();
    if pts.is_empty() {
        *o += NO_DATA;
        return Ok(());
    }
    let ev: Vec<&Event> = ev.iter().filter(|e| e.t_s.is_finite()).collect();
    let (xmin, xmax) = bounds(pts.iter().map(|p| p.0).chain(ev.iter().map(|e| e.t_s)));
    let (ymin, ymax) = bounds(pts.iter().map(|p| p.1));
    let (min_pos, _) = bounds(pts.iter().map(|p| p.1).filter(|v| *v > 0.0));
    let log = log_ok && ymin >= 0.0 && min_pos.is_finite() && ymax / min_pos >= 100.0;
    let (x, y) = (Axis::linear(xmin, xmax), Axis::linear(ymin.min(0.0), ymax));
    let y = if log { Axis::log(min_pos, ymax) } else { y };
    let y_title = format!("{y_title}{}", if log { ", log scale" } else { "" });
    svg_open(o, &y, "time since start (s)", &y_title)?;
    for (v, label) in &x.ticks {
        let xv = x.x(*v);
        line(o, (xv, BOTTOM), (xv, BOTTOM + 4.0), "ax")?;
        text(o, (xv, BOTTOM + 16.0), 0, "mid", label)?;
    }
    for e in &ev {
        let ex = x.x(e.t_s);
        line(o, (ex, MT), (ex, BOTTOM), "ev")?;
        text(o, (ex + 3.0, MT + 4.0), 90, "evt", &esc(&e.what))?;
    }
    for (_, color, points) in series {
        let mut run = Vec::new();
        for p in points.iter().map(finite) {
            match p {
                Some((a, b)) => run.push(format!("{},{}", r1(x.x(a)), r1(y.y(b)))),
                None => flush(o, &mut run, color)?,
            }
        }
        flush(o, &mut run, color)?;
    }
    let mut lx = ML;
    for (name, color, _) in series.iter().filter(|_| series.len() > 1) {
        write!(o, r#"<rect x="{lx}" y="8" width="16" height="5""#)?;
        write!(o, r#" fill="{color}"/>"#)?;
        text(o, (lx + 22.0, 16.0), 0, "", &esc(name))?;
        lx += 34.0 + 6.5 * name.chars().count() as f64;
    }
    writeln!(o, "</svg>")
}

/// Bars by bucket index (the bounds are log-spaced), a few labelled by their lower bound; each
/// bar's range and count show as its tooltip.
fn histogram(o: &mut String, title: &str, h: Option<&Histogram>) -> Result {
    writeln!(o, "<h3>{}</h3>", esc(title))?;
    let Some(h) = h.filter(|h| h.counts.iter().any(|c| *c > 0)) else {
        *o += NO_DATA;
        return Ok(());
    };
    let y = Axis::linear(0.0, h.counts.iter().copied().max().unwrap_or(1) as f64);
    let x_title = "lateness (ms), log-spaced buckets labelled by lower bound";
    svg_open(o, &y, x_title, "samples")?;
    let bw = PW / h.counts.len() as f64;
    let every = h.counts.len().div_ceil(10);
    for (i, &c) in h.counts.iter().enumerate() {
        let (x0, top) = (ML + bw * i as f64, y.y(c as f64));
        let range = match (h.bounds_ms.get(i), h.bounds_ms.get(i + 1)) {
            (Some(a), Some(b)) => format!("{} – {} ms", compact(*a), compact(*b)),
            (Some(a), None) => format!("≥ {} ms", compact(*a)),
            _ => format!("bucket {i}"),
        };
        let (bx, w, ht, top) = (r1(x0 + bw * 0.05), r1(bw * 0.9), r1(BOTTOM - top), r1(top));
        write!(o, r#"<rect class="bar" x="{bx}" y="{top}" width="{w}""#)?;
        write!(o, r#" height="{ht}"><title>{range}: {c}</title></rect>"#)?;
        if let Some(a) = h.bounds_ms.get(i).filter(|_| i % every == 0) {
            text(o, (x0, BOTTOM + 16.0), 0, "mid", &compact(*a))?;
        }
    }
    writeln!(o, "</svg>")
}

// ---- formatting ------------------------------------------------------------------------------

/// Escapes `& < > " '` for HTML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' => out += "&quot;",
            '\'' => out += "&#39;",
            _ => out.push(c),
        }
    }
    out
}

/// `v` with `decimals` decimals, or "–" when it is NaN or infinite.
fn num(v: f64, decimals: usize) -> String {
    match v.is_finite() {
        true => format!("{:.*}", decimals, v + 0.0), // `+ 0.0` turns -0 into 0
        false => DASH.to_string(),
    }
}

/// A pixel coordinate, one decimal.
fn r1(v: f64) -> String {
    num(v, 1)
}

/// Milliseconds: two decimals below 100 ms, one above.
fn ms(v: f64) -> String {
    num(v, if v.abs() >= 100.0 { 1 } else { 2 })
}

/// Rates: whole numbers, one decimal below 10/s.
fn rate(v: f64) -> String {
    num(v, if v.abs() >= 10.0 { 0 } else { 1 })
}

/// At least three significant digits, trailing zeros dropped: `0.25`, `2.5`, `1000`, `20000`.
fn compact(v: f64) -> String {
    // NaN casts to 0; 0 gets 9 decimals, all trimmed.
    let s = num(v, (2.0 - v.abs().log10().floor()).clamp(0.0, 9.0) as usize);
    match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => s,
    }
}

/// A linear axis label: as many decimals as the step needs, `k`/`M` for large values.
fn tick_label(v: f64, step: f64) -> String {
    let (v, step, unit) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, step / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, step / 1e3, "k"),
        _ => (v, step, ""),
    };
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{}{unit}", num(v, decimals))
}

/// `v`, in red and bold when `bad`.
fn flag(bad: bool, v: impl std::fmt::Display) -> String {
    let class = if bad { " class=\"bad\"" } else { "" };
    format!("<span{class}>{v}</span>")
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn h2(o: &mut String, title: &str) -> Result {
    writeln!(o, "<h2>{}</h2>", esc(title))
}

fn list(o: &mut String, items: &[String]) -> Result {
    *o += "<ul>";
    for i in items {
        write!(o, "<li>{}</li>", esc(i))?;
    }
    writeln!(o, "</ul>")
}

/// `head` is plain text, columns separated by `|`; cells are HTML (escaped by the caller), and
/// right-aligned when they look like numbers. No rows shows "no data".
fn table(o: &mut String, head: &str, rows: Vec<Vec<String>>) -> Result {
    if rows.is_empty() {
        *o += NO_DATA;
        return Ok(());
    }
    *o += "<table><tr>";
    for h in head.split('|') {
        write!(o, "<th>{}</th>", esc(h))?;
    }
    for row in &rows {
        *o += "</tr>\n<tr>";
        for c in row {
            let n = c.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '–');
            let class = if n { " class=\"n\"" } else { "" };
            write!(o, "<td{class}>{c}</td>")?;
        }
    }
    writeln!(o, "</tr></table>")
}

/// A two-column table: plain-text keys, HTML values.
fn kv(o: &mut String, caption: &str, rows: &[(&str, String)]) -> Result {
    write!(o, "<table><caption>{}</caption>", esc(caption))?;
    for (k, v) in rows {
        write!(o, "<tr><th>{}</th><td>{v}</td></tr>", esc(k))?;
    }
    writeln!(o, "</table>")
}

#[cfg(test)]
mod tests;
