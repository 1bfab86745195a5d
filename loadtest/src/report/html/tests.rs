use super::super::*;
use super::*;

const EVIL: &str = "<script>alert('x&y')</script>";

#[rustfmt::skip]
fn full() -> Report {
    let bucket = |t_s: f64, n: u64, lat: Option<f64>| Bucket {
        t_s, created: n, fired: n, started: n, completed: n, fire_p50_ms: lat,
        fire_p99_ms: lat.map(|v| v * 10.0), fire_max_ms: lat.map(|v| v * 100.0),
        start_p99_ms: lat.map(|v| v * 20.0),
    };
    let pct = Percentiles {
        count: 10, p50: 0.5, p90: 2.0, p99: 3.5, p999: 12.25, max: 150.0, ..Default::default()
    };
    let target = |what: &str, met| TargetCheck {
        what: what.into(), target: "< 3 ms".into(), measured: "2 ms".into(), met,
    };
    let hist = |bounds_ms: Vec<f64>, counts: Vec<u64>| Some(Histogram { bounds_ms, counts });
    Report {
        version: VERSION,
        run_id: "run-42".into(),
        scenario: format!("burst {EVIL}"),
        params: serde_json::json!({ "jobs": 1000, "note": EVIL }),
        started_at: "2025-01-01T00:00:00Z".parse().unwrap(),
        finished_at: "2025-01-01T00:01:30.500Z".parse().unwrap(),
        machine: Machine {
            hostname: "box".into(), cpus: 8, cpu_model: "Some CPU".into(),
            memory_bytes: 16 << 30, kernel: "6.1".into(), load_start: 0.5, load_end: 3.25,
            wake: WakeCost {
                cross_core: Some(RoundTrip { cpu_us: 68.26, wall_us: 91.0 }), same_core: None,
            },
        },
        platform: PlatformInfo {
            url: "http://127.0.0.1:8080".into(), nats_url: "nats://127.0.0.1:4222".into(),
            nats_version: "2.11.0".into(), chronoshard_version: "chronoshard 0.1.0 (abc1234)".into(),
            spawned: true, shard_nodes: 3, workers: 4,
        },
        create: Some(CreateStats {
            requested: 1000, created: 990, failed: 10, errors: vec![EVIL.into()],
            target_per_s: 500.0, achieved_per_s: 498.7, latency_ms: pct, retried: 3,
        }),
        fire: Some(PhaseStats { count: 990, per_s: 100.0, lateness_ms: pct }),
        start: Some(PhaseStats { count: 990, per_s: 99.0, lateness_ms: pct }),
        end_to_end: Some(Throughput {
            completed: 990, window_s: 10.0, per_s: 99.0,
            cpu_us_per_job: vec![
                CpuPerUnit { name: EVIL.into(), pid: 9, us: 50.0 },
                CpuPerUnit { name: "chronoshard dev".into(), pid: 8, us: 100.4 },
            ],
        }),
        correctness: Some(Correctness {
            expected: 1000, fired: 999, executed: 998, missed: 2,
            occurrences_with_two_tickets: 1, tickets_executed_twice: 3, occurrences_executed_twice: 3,
            executed_twice_after_worker_death: 1, examples: vec![format!("job 7: {EVIL}")],
            ..Default::default()
        }),
        raw: Some(RawStats {
            count: 5000, target_per_s: 0.0, per_s: 2e4, round_trip_ms: pct,
            cpu_us_per_round_trip: vec![CpuPerUnit { name: "nats-server".into(), pid: 7, us: 40.0 }],
        }),
        ratios: vec![Ratio { what: "fire/s".into(), platform: 100.0, raw: 2e4, ratio: 0.005 }],
        processes: vec![ProcessStats {
            name: "shard-node".into(), pid: 123, cpu_s: 4.5, cpu_cores: 0.05,
            peak_rss_bytes: 64 << 20, hwm_rss_bytes: 70 << 20,
        }],
        timeline: Timeline { bucket_ms: 1000, buckets: vec![
            bucket(0.0, 100, Some(0.5)), bucket(1.0, 120, None), bucket(2.0, 80, Some(1.5)),
            bucket(3.0, 90, Some(f64::NAN)), bucket(4.0, 0, Some(0.7)),
            bucket(5.0, 10, Some(0.2)),
        ] },
        fire_histogram: hist(vec![0.1, 0.25, 1.0, 2.5, 10.0], vec![5, 50, 30, 0, 2]),
        fairness: None,
        growth: Some(Growth {
            shards_from: 4, shards_added: 4, shards_after: Some(8), started_s: 10.0,
            ended_s: Some(12.5), duration_s: Some(2.5), node: format!("node {EVIL}"),
            node_joined_s: Some(14.0), node_owned_shards_s: None, tenants_moved: 97,
            phases: ["before", "during", "after"].map(|name| GrowthPhase {
                name: name.into(), from_s: None, to_s: Some(1.0),
                fire: PhaseStats { count: 10, per_s: 5.0, lateness_ms: pct },
                start: PhaseStats::default(),
            }).to_vec(),
        }),
        start_histogram: hist(vec![0.1, 1.0], vec![3, 7, 1]),
        events: vec![Event { t_s: 2.5, what: format!("kill worker {EVIL}") }],
        server: vec![ServerView {
            what: format!("fire {EVIL}"), metric: "m{}".into(), count: 1000,
            within: vec![(1.0, 0.5), (3.0, 0.99), (10.0, 0.995)],
            p99_ms: (1.0, Some(3.0)), p999_ms: (10.0, None),
        }],
        targets: vec![target("p99", Some(true)), target(EVIL, Some(false)), target("x", None)],
        warnings: vec![format!("warn {EVIL}")],
    }
}

/// Empty, single-point, all-zero, NaN and infinite inputs.
#[rustfmt::skip]
fn degenerate() -> Vec<Report> {
    let inf = Bucket { t_s: 1.0, fire_p50_ms: Some(f64::INFINITY), ..Bucket::default() };
    let one = Bucket { fire_p99_ms: Some(5.0), ..inf.clone() };
    let hist = |bounds_ms: Vec<f64>, counts: Vec<u64>| Some(Histogram { bounds_ms, counts });
    let mut a = full();
    a.timeline.buckets = vec![inf.clone(), Bucket::default()];
    let event = |t_s: f64| Event { t_s, what: "x".into() };
    a.events = vec![event(f64::NAN), event(1e308), event(f64::NEG_INFINITY)];
    a.fire_histogram = hist(vec![], vec![0, 0]);
    a.start_histogram = hist(vec![1.0; 50], vec![1; 3]);
    let mut b = full();
    b.timeline = Timeline { bucket_ms: 0, buckets: vec![one, Bucket { t_s: f64::NAN, ..inf }] };
    b.fire_histogram = hist(vec![0.0, f64::NAN], vec![u64::MAX, 1]);
    b.start_histogram = hist(vec![], vec![]);
    vec![a, b]
}

#[test]
fn full_report_has_every_section_and_escapes_strings() {
    let r = full();
    let html = render(&r);
    let titles = [
        "Targets",
        "Warnings",
        "Summary",
        "Correctness",
        "Ratios to raw JetStream",
        "Adding shards",
    ];
    let plots = [
        "Lateness over time",
        "Throughput over time",
        "Lateness histograms",
    ];
    for t in titles.iter().chain(&plots).chain(&["Processes", "Events"]) {
        assert!(html.contains(&format!("<h2>{t}</h2>")), "{t}");
    }
    let expected = [
        "<h3>Examples</h3>",
        "<h3>Create errors (first few)</h3>",
        "<svg",
        "<polyline",
        "class=\"bar\"",
        "class=\"ev\"",
        "log scale",
        "&lt;script&gt;alert(&#39;x&amp;y&#39;)&lt;/script&gt;",
        "CPU per job 150 µs (chronoshard dev 100 · &lt;script&gt;",
        "CPU per round trip 40 µs (nats-server 40)",
        ">met<",
        ">not met<",
        ">not judged<",
        "<th>missed</th><td><span class=\"bad\">2</span>",
        "<th>occurrences with two tickets</th><td><span class=\"bad\">1</span>",
        "<th>… without a worker death</th><td><span class=\"bad\">2</span>",
        ">90.5 s<",
        ">16.0 GiB<",
        "<th>a thread wake-up round trip</th><td>68.3 µs CPU (91.0 µs wall) across two cores</td>",
        ">64.0<",
        "<th>shards</th><td>4 + 4 → 8</td>",
        "<th>growth took</th><td>2.50 s</td>",
        "<td>during</td><td class=\"n\">–</td><td class=\"n\">1.00 s</td>",
        "<h3>The platform's own histograms (its /metrics, over this run)</h3>",
        ": 1000 · 50.0% ≤ 1 ms · 99.0% ≤ 3 ms · 99.5% ≤ 10 ms · p99 in (1, 3] ms · p99.9 &gt; 10 ms</li>",
    ];
    for e in expected {
        assert!(html.contains(e), "{e}");
    }
    // No scripts at all (so the escaped one is the only trace), nothing fetched.
    let rest = html.replace(&r.platform.url, "");
    for e in [
        "<script", "http://", "https://", "src=", "href=", "url(", "NaN", "inf",
    ] {
        assert!(!rest.contains(e), "{e}");
    }
}

#[test]
fn default_report_renders_no_data() {
    let html = render(&Report::default());
    assert!(html.contains("no data"));
    assert!(html.contains("<th>a thread wake-up round trip</th><td>not measured</td>"));
    assert!(!html.contains("<svg"));
    assert!(html.ends_with("</html>\n"));
}

#[test]
fn degenerate_data_does_not_panic() {
    let [a, b] = <[Report; 2]>::try_from(degenerate()).unwrap();
    let a = render(&a);
    assert!(a.contains("<svg") && a.contains("no data") && !a.contains("NaN"));
    let b = render(&b);
    assert!(b.contains("<circle") && !b.contains("NaN"));
}

#[test]
fn axes_pick_nice_ticks() {
    let labels = |a: Axis| {
        a.ticks
            .into_iter()
            .map(|t| t.1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let cases = [
        (Axis::linear(0.0, 97.0), "0 20 40 60 80 100"),
        (Axis::linear(0.0, 0.7), "0.0 0.2 0.4 0.6 0.8"),
        (Axis::linear(0.0, 25e3), "0 5000 10k 15k 20k 25k"),
        (Axis::linear(0.0, 0.0), "0.0 0.2 0.4 0.6 0.8 1.0"),
        (Axis::linear(5.0, 5.0), "4.4 4.6 4.8 5.0 5.2 5.4 5.6"),
        (Axis::log(0.3, 2e3), "0.1 1 10 100 1000 10000"),
    ];
    for (axis, want) in cases {
        assert_eq!(labels(axis), want);
    }
    let compacts = [0.25, 2.5, 1e3, 0.0, f64::NAN].map(compact);
    assert_eq!(compacts, ["0.25", "2.5", "1000", "0", DASH]);
    assert_eq!(esc("<a b='x'>&\""), "&lt;a b=&#39;x&#39;&gt;&amp;&quot;");
}
