//! The platform's own histograms, read from its `GET /metrics` (Prometheus text,
//! docs/metrics.md) before and after the run, so the report shows what the platform measured
//! itself beside what the load test's probes saw. They time other moments than the probes: the
//! shards' fire lateness runs until the ticket is handed to the NATS client (before nats-server
//! forwards it to the watcher and the workers) and, in a second histogram, until JetStream's
//! ack of the publish is handled by the shard (after that); the server's request time
//! runs from its router taking the request to the handler's answer, without hyper reading and
//! writing the connection or the wait for a runtime thread, which the client's figure has along
//! with the client's own HTTP stack and pacer. Histograms only say which bucket an observation
//! fell in, so a view gives shares at the bucket bounds and the pair of bounds a percentile lies
//! between, never an interpolated value.
//!
//! It only reads. What it covers is what the process behind the API URL counts: with `dev`,
//! every shard in it; shard nodes run as their own processes (`fault`) are not in it, and on a
//! shared platform other clients' traffic is. The count says how many observations it holds.

use crate::report::ServerView;

/// Cumulative counts per upper bound (seconds; `f64::INFINITY` last), summed over series.
#[derive(Clone, Debug, PartialEq)]
struct Cumulative(Vec<(f64, f64)>);

/// A count went down between the two readings: the process restarted (or is another one).
#[derive(Debug, PartialEq)]
struct Reset;

/// The `_bucket` series of histogram `name` whose labels include every `(label, value)` of
/// `only`, summed per bound. `None` when the text has no such series.
fn cumulative(text: &str, name: &str, only: &[(&str, &str)]) -> Option<Cumulative> {
    let prefix = format!("{name}_bucket{{");
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        // The last brace ends the labels: route labels hold braces (`/v1/jobs/{id}`).
        let Some((labels, value)) = rest.rsplit_once('}') else {
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
    (!sums.is_empty()).then_some(Cumulative(sums))
}

/// `a="x",b="y"` → pairs; the platform's label values hold no quotes or commas (braces, yes).
fn parse_labels(s: &str) -> Vec<(&str, &str)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect()
}

impl Cumulative {
    /// What was observed between the `before` reading and this one (a series absent before
    /// counts from zero). A count lower than before means the counters started again, and
    /// then neither reading tells what this run did.
    fn since(&self, before: Option<&Cumulative>) -> Result<Cumulative, Reset> {
        let was = |le: f64| {
            before
                .and_then(|b| b.0.iter().find(|(l, _)| *l == le))
                .map_or(0.0, |&(_, c)| c)
        };
        let mut out = Vec::with_capacity(self.0.len());
        for &(le, c) in &self.0 {
            if c < was(le) {
                return Err(Reset);
            }
            out.push((le, c - was(le)));
        }
        // A bound that disappeared went down to nothing.
        if before.is_some_and(|b| b.0.iter().any(|(le, _)| !out.iter().any(|(l, _)| l == le))) {
            return Err(Reset);
        }
        Ok(Cumulative(out))
    }

    fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |&(_, c)| c)
    }

    /// The bucket holding the observation of rank `ceil(q × n)`, as the bounds (ms) it lies
    /// above and at or under; no upper bound when it is above the last finite one.
    fn percentile(&self, q: f64) -> (f64, Option<f64>) {
        let n = self.count();
        let mut lower = 0.0;
        for &(le, c) in &self.0 {
            if !le.is_finite() {
                break;
            }
            if c >= q * n {
                return (lower, Some(le * 1e3));
            }
            lower = le * 1e3;
        }
        (lower, None)
    }
}

/// The view of histogram `name` (restricted to `only`) over the run, from the `/metrics` texts
/// read before and after it. `None` when the metric is missing or nothing was observed.
fn view(
    what: &str,
    name: &str,
    only: &[(&str, &str)],
    before: &str,
    after: &str,
) -> Result<Option<ServerView>, Reset> {
    let Some(after) = cumulative(after, name, only) else {
        return Ok(None);
    };
    let run = after.since(cumulative(before, name, only).as_ref())?;
    let n = run.count();
    if n <= 0.0 {
        return Ok(None);
    }
    let selected: Vec<String> = only.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    Ok(Some(ServerView {
        what: what.to_string(),
        metric: format!("{name}{{{}}}", selected.join(",")),
        count: n as u64,
        within: run
            .0
            .iter()
            .filter(|(le, _)| le.is_finite())
            .map(|&(le, c)| (le * 1e3, c / n))
            .collect(),
        p99_ms: run.percentile(0.99),
        p999_ms: run.percentile(0.999),
    }))
}

/// The views of a run from the `/metrics` texts read before and after it, or the warning to
/// give when they tell nothing about the run (the run goes on without them).
pub fn over_run<E: std::fmt::Display>(
    before: &Result<String, E>,
    after: &Result<String, E>,
) -> Result<Vec<ServerView>, String> {
    match (before, after) {
        (Ok(before), Ok(after)) => views(before, after).map_err(|Reset| {
            "the platform's histograms went down between the two readings of /metrics (did it \
             restart?): no view of its own histograms"
                .to_string()
        }),
        (Err(e), _) | (_, Err(e)) => Err(format!(
            "the platform's /metrics could not be read ({e}): no view of its own histograms"
        )),
    }
}

/// The views a run reports: the shards' fire lateness (at the send and at JetStream's ack) and
/// the server's create time.
fn views(before: &str, after: &str) -> Result<Vec<ServerView>, Reset> {
    use chronoshard_telemetry::metrics::{FIRE_LATENESS, FIRE_SEND_LATENESS, HTTP_DURATION};
    let create = [("method", "POST"), ("route", "/v1/jobs")];
    [
        view(
            "fire lateness as the shards measure it: scheduled → ticket handed to the NATS client",
            FIRE_SEND_LATENESS,
            &[],
            before,
            after,
        ),
        view(
            "fire lateness as the shards measure it: scheduled → JetStream's ack handled",
            FIRE_LATENESS,
            &[],
            before,
            after,
        ),
        view(
            "job creation as the server measures it: POST /v1/jobs, router → answer",
            HTTP_DURATION,
            &create,
            before,
            after,
        ),
    ]
    .into_iter()
    .filter_map(Result::transpose)
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

    fn view_of(only: &[(&str, &str)], before: &str, after: &str) -> Option<ServerView> {
        view("x", "h", only, before, after).unwrap()
    }

    #[test]
    fn a_run_is_what_the_buckets_gained_summed_over_series() {
        let v = view_of(&[], BEFORE, AFTER).unwrap();
        assert_eq!(v.count, 1000);
        assert_eq!(v.metric, "h{}");
        assert_eq!(v.within, vec![(1.0, 0.9), (3.0, 0.995), (10.0, 0.999)]);
        assert_eq!(v.share_within(3.0), Some(0.995));
        assert_eq!(v.share_within(2.0), None, "not a bound");
        // The 990th observation is among those between 1 and 3 ms, the 999th between 3 and 10.
        assert_eq!(v.p99_ms, (1.0, Some(3.0)));
        assert_eq!(v.p999_ms, (3.0, Some(10.0)));
    }

    #[test]
    fn labels_select_series() {
        let v = view_of(&[("shard", "1")], BEFORE, AFTER).unwrap();
        assert_eq!(v.count, 500);
        assert_eq!(v.metric, r#"h{shard="1"}"#);
        assert_eq!(v.within[0], (1.0, 0.8));
        // 495 of 500 within 3 ms is 99%; 499 within 10 ms is 99.8%, so p99.9 is above it.
        assert_eq!(v.p99_ms, (1.0, Some(3.0)));
        assert_eq!(v.p999_ms, (10.0, None));
        // Below the first bound: the bucket starts at zero.
        let first = "h_bucket{le=\"0.001\"} 5\nh_bucket{le=\"+Inf\"} 5\n";
        assert_eq!(view_of(&[], "", first).unwrap().p99_ms, (0.0, Some(1.0)));
    }

    #[test]
    fn a_label_value_with_braces_is_read_whole() {
        let text = "h_bucket{route=\"/v1/jobs/{id}\",le=\"0.001\"} 3\n\
                    h_bucket{route=\"/v1/jobs/{id}\",le=\"+Inf\"} 4\n\
                    h_bucket{route=\"/v1/jobs\",le=\"+Inf\"} 9\n";
        let v = view_of(&[("route", "/v1/jobs/{id}")], "", text).unwrap();
        assert_eq!((v.count, v.within.clone()), (4, vec![(1.0, 0.75)]));
    }

    /// Counts that went down (the process behind the URL restarted between the readings) say
    /// nothing true about the run: no view, and the run is told why.
    #[test]
    fn counters_that_went_down_give_a_warning_not_a_view() {
        let before = "h_bucket{le=\"0.001\"} 100\nh_bucket{le=\"+Inf\"} 100\n";
        let restarted = "h_bucket{le=\"0.001\"} 50\nh_bucket{le=\"0.003\"} 250\n\
                         h_bucket{le=\"+Inf\"} 300\n";
        assert_eq!(view("x", "h", &[], before, restarted), Err(Reset));
        let gone = "h_bucket{le=\"0.003\"} 250\nh_bucket{le=\"+Inf\"} 300\n";
        assert_eq!(view("x", "h", &[], before, gone), Err(Reset));
        let text = |t: &str| {
            Ok::<_, String>(t.replace("h_bucket", "chronoshard_fire_lateness_seconds_bucket"))
        };
        let warning = over_run(&text(before), &text(restarted)).unwrap_err();
        assert!(warning.contains("did it restart?"), "{warning}");
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
        assert_eq!(view("x", "absent", &[], BEFORE, AFTER), Ok(None));
        assert_eq!(view_of(&[("shard", "9")], BEFORE, AFTER), None);
        assert_eq!(view_of(&[("shard", "0")], BEFORE, BEFORE), None);
        assert_eq!(view_of(&[], "", ""), None);
    }
}
