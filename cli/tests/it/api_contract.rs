//! The external contract of the REST API: schedule previews (DST rules included) and problem
//! documents for bad input.

use crate::common::*;
use serde_json::{json, Value};

async fn preview(api: &Api, query: &str) -> Vec<String> {
    let (status, body) = api.get(&format!("/v1/schedule/preview?{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    body["fire_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn q(cron: &str, tz: &str, after: &str, count: u32) -> String {
    format!(
        "cron={}&timezone={tz}&after={after}&count={count}",
        cron.replace(' ', "%20")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_follows_the_dst_rules() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let cases: &[(&str, &str, &str, u32, &[&str])] = &[
        // the contract's example: Berlin spring gap, single hour → once at the gap's end
        (
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            3,
            &[
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
            ],
        ),
        // Berlin autumn overlap, single hour → only the first 02:30
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T00:00:00Z",
            3,
            &[
                "2026-10-24T00:30:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z",
            ],
        ),
        // Berlin gap, wildcard hour → the missing local times simply do not exist
        (
            "*/30 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:00:00Z",
            4,
            &[
                "2026-03-29T00:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:30:00Z",
                "2026-03-29T02:00:00Z",
            ],
        ),
        // Berlin overlap, wildcard hour → 02:30 fires at both instants
        (
            "30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:00:00Z",
            3,
            &[
                "2026-10-24T23:30:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:30:00Z",
            ],
        ),
        // New York spring gap, single hour → 03:00 EDT
        (
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T00:00:00Z",
            3,
            &[
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
            ],
        ),
        // New York autumn overlap, single hour → only the first 01:30 (EDT)
        (
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T00:00:00Z",
            3,
            &[
                "2026-10-31T05:30:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:30:00Z",
            ],
        ),
        // New York overlap, wildcard hour → 01:00 and 01:30 at both instants
        (
            "0,30 * * * *",
            "America/New_York",
            "2026-11-01T05:00:00Z",
            4,
            &[
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:00:00Z",
            ],
        ),
        // an expression that never fires
        ("0 0 30 2 *", "UTC", "2026-01-01T00:00:00Z", 5, &[]),
    ];
    for (cron, tz, after, count, want) in cases {
        assert_eq!(
            preview(&api, &q(cron, tz, after, *count)).await,
            *want,
            "{cron} in {tz} after {after}"
        );
    }
    assert_eq!(
        preview(
            &api,
            "every=90s&start_at=2026-01-01T00:00:00Z&after=2026-01-01T00:01:00Z&count=2"
        )
        .await,
        ["2026-01-01T00:01:30Z", "2026-01-01T00:03:00Z"]
    );
    for (query, field) in [
        (q("0 61 * * *", "UTC", "2026-01-01T00:00:00Z", 1), "cron"),
        (
            q("0 * * * *", "Mars/Olympus", "2026-01-01T00:00:00Z", 1),
            "timezone",
        ),
        (q("0 * * * *", "UTC", "2026-01-01T00:00:00Z", 1001), "count"),
        ("every=soon".to_string(), "every"),
        ("count=3".to_string(), "cron"),
    ] {
        let (status, problem) = api.get(&format!("/v1/schedule/preview?{query}")).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (400, Some(field)),
            "{query}: {problem}"
        );
    }
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_problem_document_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let good = json!({"tenant": "bad", "name": "n", "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/"}});
    let with = |path: &[&str], value: Value| {
        let mut b = good.clone();
        let (last, parents) = path.split_last().unwrap();
        let mut cur = &mut b;
        for k in parents {
            cur = &mut cur[*k];
        }
        cur[*last] = value;
        b.to_string()
    };
    let cases = [
        ("{\"tenant\": \"bad\", ".to_string(), "invalid_json", None),
        ("nonsense".to_string(), "invalid_json", None),
        ("[]".to_string(), "invalid_field", Some("body")),
        (
            with(&["colour"], json!("red")),
            "invalid_field",
            Some("colour"),
        ),
        (
            with(&["schedule", "tz"], json!("UTC")),
            "invalid_field",
            Some("schedule.tz"),
        ),
        (
            with(&["schedule", "cron"], json!("61 * * * *")),
            "invalid_field",
            Some("schedule.cron"),
        ),
        (
            with(&["schedule", "cron"], json!("* * *")),
            "invalid_field",
            Some("schedule.cron"),
        ),
        (
            with(&["schedule", "timezone"], json!("Europe/Atlantis")),
            "invalid_field",
            Some("schedule.timezone"),
        ),
        (
            with(&["priority"], json!("high")),
            "invalid_field",
            Some("priority"),
        ),
        (
            with(&["target", "url"], json!("ftp://x")),
            "invalid_field",
            Some("target.url"),
        ),
        (
            with(&["tenant"], json!("has space")),
            "invalid_field",
            Some("tenant"),
        ),
        (
            with(&["schedule", "every"], json!("1s")),
            "invalid_field",
            Some("schedule"),
        ),
    ];
    for (body, code, field) in cases {
        let (status, ctype, problem) = api
            .send(reqwest::Method::POST, "/v1/jobs", Some(&body))
            .await;
        assert_eq!(status, 400, "{body}: {problem}");
        assert_eq!(ctype, "application/problem+json");
        assert_eq!(problem["code"], code, "{body}: {problem}");
        assert_eq!(problem["status"], 400);
        assert_eq!(problem["field"].as_str(), field, "{body}: {problem}");
        if let Some(f) = field {
            assert!(problem["detail"].as_str().unwrap().contains(f), "{problem}");
        }
        assert!(problem["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:chronoshard:problem:"));
    }
    // nothing was created by any of them
    let (_, page) = api.get("/v1/jobs?tenant=bad").await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 0);
    // unknown ids, bad query parameters, missing token
    let (s, problem) = api
        .get("/v1/jobs/01a2266c-4aba-702e-af93-ab811c4c4b7c")
        .await;
    assert_eq!((s, problem["code"].as_str()), (404, Some("not_found")));
    let (s, problem) = api.get("/v1/tickets/not-a-uuid").await;
    assert_eq!((s, problem["code"].as_str()), (404, Some("not_found")));
    let (s, problem) = api.get("/v1/jobs?limit=0").await;
    assert_eq!((s, problem["field"].as_str()), (400, Some("limit")));
    let (s, problem) = api.get("/v1/jobs?colour=red").await;
    assert_eq!((s, problem["field"].as_str()), (400, Some("colour")));
    let resp = reqwest::get(format!("{}/v1/jobs", api.base)).await.unwrap();
    assert_eq!(resp.status(), 401);
    // operational endpoints need no token
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json", "/docs/"] {
        let resp = reqwest::get(format!("{}{path}", api.base)).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    p.stop().await.unwrap();
}

/// Many creates at once on one tenant (one shard, so they queue together and are written in
/// shared transactions): each gets its own answer. A repeated Idempotency-Key with the same body
/// answers the first job (200), with another body 422 `idempotency_key_reused`; whichever of a
/// pair comes first creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_at_once_each_get_their_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = std::sync::Arc::new(Api::new(&p));
    let body = |name: &str| {
        json!({"tenant": "many", "name": name, "schedule": {"at": "2099-01-01T00:00:00Z"},
            "target": {"type": "queue", "queue": "q"}})
        .to_string()
    };
    // keys 0..100 once; keys 0..50 again with the same body, 50..100 with another one.
    let mut requests: Vec<(usize, String)> =
        (0..100).map(|k| (k, body(&format!("j{k}")))).collect();
    requests.extend((0..50).map(|k| (k, body(&format!("j{k}")))));
    requests.extend((50..100).map(|k| (k, body(&format!("other{k}")))));
    let mut set = tokio::task::JoinSet::new();
    for (i, (key, body)) in requests.into_iter().enumerate() {
        let api = api.clone();
        set.spawn(async move {
            let req = api
                .http
                .post(format!("{}/v1/jobs", api.base))
                .bearer_auth(&api.token)
                .header("content-type", "application/json")
                .header("idempotency-key", format!("key-{key}"))
                .body(body);
            let resp = req.send().await.expect("request sent");
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap();
            (i, key, status, v)
        });
    }
    let mut by_key: std::collections::BTreeMap<usize, Vec<(u16, Value)>> = Default::default();
    while let Some(r) = set.join_next().await {
        let (_, key, status, v) = r.unwrap();
        by_key.entry(key).or_default().push((status, v));
    }
    let mut ids = std::collections::BTreeSet::new();
    for (key, answers) in &by_key {
        assert_eq!(answers.len(), 2, "key {key}: {answers:?}");
        let created: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
        assert_eq!(created.len(), 1, "key {key}: one create wins: {answers:?}");
        let id = created[0].1["id"].as_str().unwrap().to_string();
        let other = answers.iter().find(|(s, _)| *s != 201).unwrap();
        if *key < 50 {
            assert_eq!(other.0, 200, "key {key}: {answers:?}");
            assert_eq!(other.1["id"].as_str(), Some(id.as_str()), "key {key}");
        } else {
            assert_eq!(other.0, 422, "key {key}: {answers:?}");
            assert_eq!(other.1["code"], "idempotency_key_reused", "key {key}");
        }
        ids.insert(id);
    }
    assert_eq!(ids.len(), 100);
    let (status, page) = api.get("/v1/jobs?tenant=many&limit=500").await;
    assert_eq!(status, 200, "{page}");
    let listed: std::collections::BTreeSet<String> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, ids,
        "exactly the jobs answered as created are stored"
    );
    p.stop().await.unwrap();
}
