//! Limits that protect the platform, against a running dev platform: a body or a job payload too
//! large (413), a URL too long (414), a tenant creating faster than `tenant_create_rate` or
//! beyond `tenant_max_jobs` (429 with `Retry-After`). A refused request changes nothing, other
//! tenants are not held back, and a create repeated with its idempotency key is answered with its
//! job even while its tenant is limited.

use std::time::{Duration, Instant};

use crate::common::*;
use reqwest::Method;
use serde_json::{json, Value};

fn job(tenant: &str, name: &str) -> Value {
    json!({"tenant": tenant, "name": name, "schedule": {"cron": "0 3 * * *"},
        "target": {"type": "queue", "queue": "nobody"}})
}

/// A create's status, code and `Retry-After` (seconds).
async fn create(api: &Api, body: &Value, key: Option<&str>) -> (u16, Value, Option<u64>) {
    let mut req = api
        .http
        .post(format!("{}/v1/jobs", api.base))
        .bearer_auth(&api.token)
        .json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (status, resp.json().await.unwrap(), retry)
}

async fn count(api: &Api, tenant: &str) -> usize {
    let (status, page) = api
        .get(&format!("/v1/jobs?tenant={tenant}&limit=500"))
        .await;
    assert_eq!(status, 200, "{page}");
    page["jobs"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_requests_and_fast_or_full_tenants_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);

    // A body over 1 MiB, a payload over 256 KiB in a body under it, a URL over 8 KiB.
    let mut huge = job("big", "huge");
    huge["payload"] = json!("x".repeat(1 << 20));
    let (status, problem, _) = create(&api, &huge, None).await;
    assert_eq!(
        (status, &problem["code"]),
        (413, &json!("too_large")),
        "{problem}"
    );
    let mut heavy = job("big", "heavy");
    heavy["payload"] = json!({"blob": "x".repeat(300 << 10)});
    let (status, problem, _) = create(&api, &heavy, None).await;
    assert_eq!(
        (status, &problem["field"]),
        (413, &json!("payload")),
        "{problem}"
    );
    assert_eq!(count(&api, "big").await, 0, "nothing created");
    let id = api.create(&job("big", "light")).await;
    let patch = json!({"payload": {"blob": "x".repeat(300 << 10)}}).to_string();
    let (status, _, problem) = api
        .send(Method::PATCH, &format!("/v1/jobs/{id}"), Some(&patch))
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (413, &json!("payload")),
        "{problem}"
    );
    let (_, unchanged) = api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(unchanged["payload"], Value::Null, "{unchanged}");
    let (status, _, problem) = api
        .send(
            Method::GET,
            &format!("/v1/jobs?tenant={}", "t".repeat(9000)),
            None,
        )
        .await;
    assert_eq!(
        (status, &problem["code"]),
        (414, &json!("uri_too_long")),
        "{problem}"
    );

    // One create per second per tenant, two at once.
    api.set_settings(json!({"tenant_create_rate": 1, "tenant_create_burst": 2}))
        .await;
    let started = Instant::now();
    let (mut created, mut refused) = (0u64, None);
    for i in 0..6 {
        let key = format!("fast-{i}");
        match create(&api, &job("fast", &key), Some(&key)).await {
            (201, _, _) => created += 1,
            (429, problem, retry) => {
                assert_eq!(problem["code"], "rate_limited", "{problem}");
                refused = Some((key, retry.expect("a Retry-After header")));
            }
            other => panic!("{other:?}"),
        }
    }
    let allowed = 2 + started.elapsed().as_secs();
    let (key, retry) = refused.expect("six creates within their rate of one per second");
    assert!(created <= allowed, "{created} created, {allowed} allowed");
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        count(&api, "fast").await as u64,
        created,
        "a refused create wrote nothing"
    );
    // Another tenant has its own rate; a create that was taken, repeated, is answered with its job.
    assert_eq!(create(&api, &job("calm", "c"), None).await.0, 201);
    let (status, first, _) = create(&api, &job("fast", "fast-0"), Some("fast-0")).await;
    assert_eq!(status, 200, "the first create's job: {first}");
    // After the wait it was told, the refused create is taken.
    let (status, _, _) = wait_for(
        "the refused create to be taken",
        Duration::from_secs(10),
        || async {
            let answer = create(&api, &job("fast", &key), Some(&key)).await;
            (answer.0 != 429).then_some(answer)
        },
    )
    .await
    .unwrap();
    assert_eq!(status, 201);

    // At most two jobs that can still fire per tenant.
    api.set_settings(json!({"tenant_create_rate": 0, "tenant_max_jobs": 2}))
        .await;
    let a = api.create(&job("full", "a")).await;
    api.create(&job("full", "b")).await;
    let (status, problem, retry) = create(&api, &job("full", "c"), None).await;
    assert_eq!(
        (status, &problem["code"], retry),
        (429, &json!("quota_exceeded"), Some(60)),
        "{problem}"
    );
    assert_eq!(count(&api, "full").await, 2);
    assert_eq!(create(&api, &job("roomy", "r"), None).await.0, 201);
    let (status, _, _) = api
        .send(Method::DELETE, &format!("/v1/jobs/{a}"), None)
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        create(&api, &job("full", "c"), None).await.0,
        201,
        "room again after a delete"
    );
    p.stop().await.unwrap();
}
