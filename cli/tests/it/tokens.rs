//! Tenant and admin tokens in a production deployment (two control-plane replicas, a shard node,
//! every role a separate process): the admin creates, lists and revokes them; a tenant token
//! reaches its own tenant's jobs, runs, tickets and dead letters only, is told that another
//! tenant's ids and names do not exist (404, never 403), and is refused every cluster endpoint
//! (403). A token works on the other replica too, stops working on both when revoked or
//! expired, and neither a token nor its secret appears in any process's output.

use std::time::Duration;

use crate::common::{cluster::*, wait_for, worker::HandWorker, Api};
use chrono::Utc;
use chronoshard_wire::ResultKind;
use reqwest::Method;
use serde_json::{json, Value};

fn api(d: &Deployment, replica: &str, token: &str) -> Api {
    Api::at(&d.control_planes[replica].1, token)
}

async fn create_token(admin: &Api, body: Value) -> (String, Value) {
    let (status, created) = admin.post("/v1/tokens", &body).await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_string();
    (token, created)
}

/// Waits until `token` gets `status` from `GET path` on `api`'s replica.
async fn answers(api: &Api, path: &str, status: u16) {
    wait_for(
        &format!("GET {path} to answer {status}"),
        Duration::from_secs(10),
        || async { (api.get(path).await.0 == status).then_some(()) },
    )
    .await
    .unwrap();
}

/// A queue job that fires at once, with one attempt (a failure is a dead letter).
fn once(tenant: &str, queue: &str) -> Value {
    json!({"tenant": tenant, "name": "once", "schedule": {"delay": "0s"},
        "target": {"type": "queue", "queue": queue}, "retry": {"max_attempts": 1}})
}

fn code(answer: &(u16, Value)) -> (u16, &str) {
    (answer.0, answer.1["code"].as_str().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_tokens_reach_their_tenant_only_on_every_replica_until_revoked() {
    let mut d = Deployment::start(1).await;
    d.control_plane("cp-1", &["--shards", "4"]).await;
    d.control_plane("cp-2", &[]).await;
    d.node("node-a").await;
    let admin = d.api("cp-1");
    wait_settled(&admin, &["node-a"]).await;

    // Bad requests create nothing.
    for (body, field) in [
        (json!({}), "tenant"),
        (json!({"tenant": "acme", "admin": true}), "admin"),
        (json!({"tenant": "a/b"}), "tenant"),
        (
            json!({"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (json!({"tenant": "acme", "scope": "all"}), "scope"),
    ] {
        let (status, problem) = admin.post("/v1/tokens", &body).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (400, Some(field)),
            "{problem}"
        );
    }
    let (_, list) = admin.get("/v1/tokens").await;
    assert_eq!(list["tokens"], json!([]));

    let (acme_token, acme) =
        create_token(&admin, json!({"tenant": "acme", "name": "acme ci"})).await;
    let (umbrella_token, _) = create_token(&admin, json!({"tenant": "umbrella"})).await;
    let (admin_token, made) = create_token(&admin, json!({"admin": true})).await;
    assert!(acme_token.starts_with("cst_"), "{acme_token}");
    assert_eq!(
        (&acme["tenant"], &acme["admin"], &acme["name"]),
        (&json!("acme"), &json!(false), &json!("acme ci"))
    );
    assert_eq!(made["admin"], true);
    let (status, list) = admin.get("/v1/tokens").await;
    assert_eq!(status, 200);
    let listed = list["tokens"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|t| t.get("token").is_none() && t.get("secret_sha256").is_none()),
        "{list}"
    );
    let (_, only) = admin.get("/v1/tokens?tenant=acme").await;
    assert_eq!(only["tokens"][0]["id"], acme["id"]);
    assert_eq!(only["tokens"].as_array().unwrap().len(), 1);

    // Created on cp-1, usable on cp-2 once the change reaches it.
    let acme1 = api(&d, "cp-1", &acme_token);
    let acme2 = api(&d, "cp-2", &acme_token);
    answers(&acme2, "/v1/jobs", 200).await;
    answers(&api(&d, "cp-2", &admin_token), "/v1/cluster", 200).await;

    // Its own tenant: create, list, read, change, pause, resume, trigger, runs.
    let mut worker = HandWorker::start(&d.nats.url(), "tok").await;
    let own = acme1.create(&once("acme", "tok")).await;
    let (status, other_create) = acme1.post("/v1/jobs", &once("umbrella", "tok")).await;
    assert_eq!(
        code(&(status, other_create.clone())),
        (403, "forbidden"),
        "{other_create}"
    );
    let theirs = admin.create(&once("umbrella", "tok")).await;
    let (_, page) = acme2.get("/v1/jobs").await;
    let ids: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [own.as_str()]);
    for path in [
        format!("/v1/jobs/{own}"),
        format!("/v1/jobs/{own}/runs"),
        "/v1/tenants/acme".into(),
        "/v1/jobs?tenant=acme".into(),
        "/v1/dlq".into(),
        "/v1/schedule/preview?cron=0+*+*+*+*&count=2".into(),
    ] {
        let (status, body) = acme1.get(&path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }

    // Both jobs fire; both attempts fail into the dead letters.
    let mut tickets = Vec::new();
    for _ in 0..2 {
        let t = worker.next_ticket(Duration::from_secs(20)).await;
        worker.report(&t, ResultKind::Failed, Some("boom")).await;
        tickets.push(t);
    }
    let own_ticket = tickets
        .iter()
        .find(|t| t.job_id.to_string() == own)
        .unwrap()
        .ticket_id;
    let their_ticket = tickets
        .iter()
        .find(|t| t.job_id.to_string() == theirs)
        .unwrap()
        .ticket_id;
    let dead = wait_for(
        "both tickets dead-lettered",
        Duration::from_secs(20),
        || async {
            let (_, page) = admin.get("/v1/dlq").await;
            (page["items"].as_array()?.len() == 2).then_some(page)
        },
    )
    .await
    .unwrap();
    assert_eq!(dead["items"].as_array().unwrap().len(), 2);
    let (_, mine) = acme1.get("/v1/dlq").await;
    let items = mine["items"].as_array().unwrap();
    assert_eq!(
        (items.len(), &items[0]["ticket_id"]),
        (1, &json!(own_ticket)),
        "{mine}"
    );
    assert_eq!(acme1.get(&format!("/v1/tickets/{own_ticket}")).await.0, 200);

    // Another tenant's ids and name: not found, never forbidden.
    let not_found = [
        (Method::GET, format!("/v1/jobs/{theirs}")),
        (Method::PATCH, format!("/v1/jobs/{theirs}")),
        (Method::DELETE, format!("/v1/jobs/{theirs}")),
        (Method::POST, format!("/v1/jobs/{theirs}/pause")),
        (Method::POST, format!("/v1/jobs/{theirs}/resume")),
        (Method::POST, format!("/v1/jobs/{theirs}/trigger")),
        (Method::GET, format!("/v1/jobs/{theirs}/runs")),
        (Method::GET, format!("/v1/tickets/{their_ticket}")),
        (Method::POST, format!("/v1/dlq/{their_ticket}/replay")),
        (Method::GET, "/v1/tenants/umbrella".into()),
        (Method::POST, "/v1/tenants/umbrella/pause".into()),
        (Method::POST, "/v1/tenants/umbrella/trigger".into()),
        (Method::GET, "/v1/jobs?tenant=umbrella".into()),
        (Method::GET, "/v1/dlq?tenant=umbrella".into()),
    ];
    for (method, path) in &not_found {
        let body = (method == Method::PATCH).then_some(r#"{"name": "mine now"}"#);
        let (status, _, problem) = acme1.send(method.clone(), path, body).await;
        assert_eq!(
            code(&(status, problem.clone())),
            (404, "not_found"),
            "{method} {path}: {problem}"
        );
    }
    // Nothing of theirs changed: still there, not paused, one run, still dead.
    let (_, job) = admin.get(&format!("/v1/jobs/{theirs}")).await;
    assert_eq!(
        (&job["name"], &job["state"]),
        (&json!("once"), &json!("completed")),
        "{job}"
    );
    let (_, runs) = admin.get(&format!("/v1/jobs/{theirs}/runs")).await;
    assert_eq!(
        runs["runs"].as_array().unwrap().len(),
        1,
        "not triggered: {runs}"
    );
    let (_, tenant) = admin.get("/v1/tenants/umbrella").await;
    assert_eq!(tenant["paused"], false, "{tenant}");
    let (_, dead) = admin.get("/v1/dlq?tenant=umbrella").await;
    assert_eq!(dead["items"].as_array().unwrap().len(), 1);
    // Its own dead letter replays.
    let (status, _) = acme1
        .post(&format!("/v1/dlq/{own_ticket}/replay"), &json!({}))
        .await;
    assert_eq!(status, 202);

    // The cluster is the admin's.
    let admin_only = [
        (Method::GET, "/v1/cluster"),
        (Method::GET, "/v1/nodes"),
        (Method::GET, "/v1/shards"),
        (Method::GET, "/v1/workers"),
        (Method::GET, "/v1/settings"),
        (Method::PUT, "/v1/settings"),
        (Method::GET, "/v1/plugins"),
        (Method::POST, "/v1/plugins"),
        (Method::PUT, "/v1/strategy"),
        (Method::POST, "/v1/nodes/node-a/drain"),
        (Method::POST, "/v1/nodes/node-a/undrain"),
        (Method::POST, "/v1/workers/w/drain"),
        (Method::GET, "/v1/tokens"),
        (Method::POST, "/v1/tokens"),
    ];
    let revoke_own = format!("/v1/tokens/{}", acme["id"].as_str().unwrap());
    for (method, path) in admin_only
        .iter()
        .map(|(m, p)| (m.clone(), p.to_string()))
        .chain([(Method::DELETE, revoke_own.clone())])
    {
        let (status, _, problem) = acme2.send(method.clone(), &path, Some("{}")).await;
        assert_eq!(
            code(&(status, problem.clone())),
            (403, "forbidden"),
            "{method} {path}: {problem}"
        );
    }
    assert_eq!(
        admin.get("/v1/nodes").await.0,
        200,
        "the drain above was refused"
    );

    // An expiring token stops at its time; a revoked one at once here, soon on the other replica.
    let soon = Utc::now() + chrono::Duration::seconds(2);
    let (brief, _) = create_token(&admin, json!({"tenant": "acme", "expires_at": soon})).await;
    let brief = api(&d, "cp-1", &brief);
    assert_eq!(brief.get("/v1/jobs").await.0, 200);
    answers(&brief, "/v1/jobs", 401).await;
    assert!(Utc::now() >= soon);

    let (status, _, _) = admin.send(Method::DELETE, &revoke_own, None).await;
    assert_eq!(status, 204);
    assert_eq!(
        acme1.get("/v1/jobs").await.0,
        401,
        "revoked on the replica that revoked it"
    );
    answers(&acme2, "/v1/jobs", 401).await;
    let (status, _, _) = admin.send(Method::DELETE, &revoke_own, None).await;
    assert_eq!(status, 404, "revoked already");
    let umbrella = api(&d, "cp-2", &umbrella_token);
    assert_eq!(
        umbrella.get("/v1/jobs").await.0,
        200,
        "the others still work"
    );

    // No token or secret in any output line of any process.
    let secrets: Vec<String> = [&acme_token, &umbrella_token, &admin_token]
        .iter()
        .flat_map(|t| [t.to_string(), t.rsplit('_').next().unwrap().to_string()])
        .chain([TOKEN.to_string()])
        .collect();
    let processes = d
        .control_planes
        .values()
        .map(|(p, _)| p)
        .chain(d.nodes.values());
    for p in processes {
        for line in p.lines() {
            for s in &secrets {
                assert!(!line.contains(s.as_str()), "a secret in the output: {line}");
            }
        }
    }
}
