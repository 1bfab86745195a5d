//! The platform's own histograms, read from its `GET /metrics` (Prometheus text, DESIGN.md §4,
//! docs/metrics.md) before and after the run, so the report shows what the platform measured
//! itself beside what the load test's probes saw. The difference is the observer's share: for
//! fires, nats-server forwarding the ticket to the watcher and the watcher's thread getting a
//! core; for creates, the HTTP client and the open-loop pacer (whose timer wakes at millisecond
//! ticks). Histograms only say which bucket an observation fell in, so the view gives shares at
//! the bucket bounds and the bound under which a percentile falls, never an interpolated value.
//!
//! It only reads. What it covers is what the process behind the API URL counts: with `dev`,
//! every shard in it; shard nodes run as their own processes (`fault`) are not in it, and on a
//! shared platform other clients' traffic is. The count says how many observations it holds.

use crate::report::ServerView;

/// Cumulative counts per upper bound (seconds; `f64::INFINITY` last), summed over series.
#[derive(Clone, Debug, PartialEq)]
struct Buckets(Vec<(f64, f64)>);

/// The `_bucket` series of histogram `name` whose labels include every `(label, value)` of
/// `only`, summed per bound. `None` when the text has no such series.
fn buckets(text: &str, name: &str, only: &[(&str, &str)]) -> Option<Buckets> {
    let prefix = format!("{name}_bucket{{");
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let labels = parse_labels(labels);
        let label = |k: &str| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        if !only.iter().all(|(k, v)| label(k) == Some(*v)) {
            continue;
        }
        let (Some(le), Ok(count)) = (label("le"), value.trim().parse::<f64>()) else {
            continue;
        };
        let le = match le {
            "+Inf" => f64::INFINITY,
            le => match le.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        match sums.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count,
            None => sums.push((le, count)),
        }
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!sums.is_empty()).then_some(Buckets(sums))
}

/// `a="x",b="y"` → pairs; the platform's label values hold no quotes or commas.
fn parse_labels(s: &str) -> Vec<(&str, &str)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect()
}

impl Buckets {
    /// What was observed between the `before` reading and this one (a series absent before
    /// counts from zero).
    fn since(&self, before: Option<&Buckets>) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|&(le, c)| {
                    let was = before
                        .and_then(|b| b.0.iter().find(|(l, _)| *l == le))
                        .map_or(0.0, |&(_, c)| c);
                    (le, (c - was).max(0.0))
                })
                .collect(),
        )
    }

    fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |&(_, c)| c)
    }

    /// The smallest finite bound holding at least `q` of the observations.
    fn bound_of(&self, q: f64) -> Option<f64> {
        let n = self.count();
        self.0
            .iter()
            .find(|&&(le, c)| le.is_finite() && c >= q * n)
            .map(|&(le, _)| le * 1e3)
    }
}

/// The view of histogram `name` (restricted to `only`) over the run, from the `/metrics` texts
/// read before and after it. `None` when the metric is missing or nothing was observed.
pub fn view(
    what: &str,
    name: &str,
    only: &[(&str, &str)],
    before: &str,
    after: &str,
) -> Option<ServerView> {
    let run = buckets(after, name, only)?.since(buckets(before, name, only).as_ref());
    let n = run.count();
    if n <= 0.0 {
        return None;
    }
    let selected: Vec<String> = only.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    Some(ServerView {
        what: what.to_string(),
        metric: format!("{name}{{{}}}", selected.join(",")),
        count: n as u64,
        within: run
            .0
            .iter()
            .filter(|(le, _)| le.is_finite())
            .map(|&(le, c)| (le * 1e3, c / n))
            .collect(),
        p99_le_ms: run.bound_of(0.99),
        p999_le_ms: run.bound_of(0.999),
    })
}

/// The views of a run from the `/metrics` texts read before and after it, or the warning to
/// give when either could not be read (the run goes on without them).
pub fn over_run<E: std::fmt::Display>(
    before: &Result<String, E>,
    after: &Result<String, E>,
) -> Result<Vec<ServerView>, String> {
    match (before, after) {
        (Ok(before), Ok(after)) => Ok(views(before, after)),
        (Err(e), _) | (_, Err(e)) => Err(format!(
            "the platform's /metrics could not be read ({e}): no view of its own histograms"
        )),
    }
}

/// The views a run reports: the shards' fire lateness and the server's create time.
fn views(before: &str, after: &str) -> Vec<ServerView> {
    use chronoshard_telemetry::metrics::{FIRE_LATENESS, HTTP_DURATION};
    let create = [("method", "POST"), ("route", "/v1/jobs")];
    [
        view(
            "fire lateness: scheduled → ticket acknowledged by JetStream, as the shards measure it",
            FIRE_LATENESS,
            &[],
            before,
            after,
        ),
        view(
            "job creation: POST /v1/jobs in the server, request in → answer out",
            HTTP_DURATION,
            &create,
            before,
            after,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP h a histogram
# TYPE h histogram
h_bucket{shard="0",le="0.001"} 10
h_bucket{shard="0",le="0.003"} 10
h_bucket{shard="0",le="0.01"} 10
h_bucket{shard="0",le="+Inf"} 10
h_sum{shard="0"} 0.005
h_count{shard="0"} 10
other_bucket{shard="0",le="0.001"} 99
"#;

    /// Two shards; shard 1 appeared during the run. Over the run: 1,000 observations, 900
    /// within 1 ms, 995 within 3 ms, 999 within 10 ms, one above.
    const AFTER: &str = r#"h_bucket{shard="0",le="0.001"} 510
h_bucket{shard="0",le="0.003"} 510
h_bucket{shard="0",le="0.01"} 510
h_bucket{shard="0",le="+Inf"} 510
h_bucket{shard="1",le="0.001"} 400
h_bucket{shard="1",le="0.003"} 495
h_bucket{shard="1",le="0.01"} 499
h_bucket{shard="1",le="+Inf"} 500
h_bucket{shard="1",le="not a number"} 7
h_bucket{shard="1",le="0.003"} garbage
h_count{shard="1"} 500
"#;

    #[test]
    fn a_run_is_what_the_buckets_gained_summed_over_series() {
        let v = view("lateness", "h", &[], BEFORE, AFTER).unwrap();
        assert_eq!(v.count, 1000);
        assert_eq!(v.metric, "h{}");
        let shares: Vec<(f64, f64)> = v.within.clone();
        assert_eq!(shares, vec![(1.0, 0.9), (3.0, 0.995), (10.0, 0.999)]);
        assert_eq!(v.share_within(3.0), Some(0.995));
        assert_eq!(v.share_within(2.0), None, "not a bound");
        assert_eq!(v.p99_le_ms, Some(3.0));
        assert_eq!(v.p999_le_ms, Some(10.0));
    }

    #[test]
    fn labels_select_series() {
        let v = view("one shard", "h", &[("shard", "1")], BEFORE, AFTER).unwrap();
        assert_eq!(v.count, 500);
        assert_eq!(v.metric, r#"h{shard="1"}"#);
        assert_eq!(v.within[0], (1.0, 0.8));
        // 495 of 500 within 3 ms is 99%; 499 within 10 ms is 99.8%, so p99.9 is above it.
        assert_eq!(v.p99_le_ms, Some(3.0));
        assert_eq!(v.p999_le_ms, None);
    }

    #[test]
    fn the_platforms_views_or_a_warning_when_metrics_cannot_be_read() {
        let text = "chronoshard_fire_lateness_seconds_bucket{shard=\"0\",le=\"0.003\"} 4\n\
                    chronoshard_fire_lateness_seconds_bucket{shard=\"0\",le=\"+Inf\"} 5\n";
        let ok = over_run::<String>(&Ok(String::new()), &Ok(text.into())).unwrap();
        assert_eq!(ok.len(), 1, "no creates in the text: only the fire view");
        assert_eq!((ok[0].count, ok[0].within.clone()), (5, vec![(3.0, 0.8)]));
        for (before, after) in [
            (Err("HTTP 404".to_string()), Ok(text.to_string())),
            (Ok(String::new()), Err("HTTP 404".to_string())),
        ] {
            let warning = over_run(&before, &after).unwrap_err();
            assert!(
                warning.contains("/metrics could not be read (HTTP 404)"),
                "{warning}"
            );
        }
    }

    #[test]
    fn a_missing_metric_or_an_idle_run_gives_no_view() {
        assert_eq!(view("x", "absent", &[], BEFORE, AFTER), None);
        assert_eq!(view("x", "h", &[("shard", "9")], BEFORE, AFTER), None);
        assert_eq!(view("x", "h", &[("shard", "0")], BEFORE, BEFORE), None);
        assert_eq!(view("x", "h", &[], "", ""), None);
    }
}
