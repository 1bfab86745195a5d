//! A job or a ticket is found from its id alone: in a new cluster the id carries its tenant's
//! routing key and nothing else is written; a cluster created by an earlier version keeps its job
//! index and asks every shard for a ticket.

use crate::common::*;
use chronoshard_wire::names;
use serde_json::{json, Value};

const TENANTS: usize = 12;

/// Creates a job of `tenant` that is due far in the future and returns its id.
async fn far_job(api: &Api, tenant: &str) -> String {
    api.create(
        &json!({"tenant": tenant, "name": "far", "schedule": {"at": "2999-01-01T00:00:00Z"},
        "target": {"type": "queue", "queue": "nobody"}}),
    )
    .await
}

/// Creates a far-future job for each of `TENANTS` tenants and checks that each is found by id,
/// by its tenant's list, and can be paused by id. Returns `(tenant, job id)` pairs.
async fn jobs_are_found_by_id_and_by_tenant(api: &Api) -> Vec<(String, String)> {
    let mut jobs = Vec::new();
    for i in 0..TENANTS {
        let tenant = format!("ids-{i}");
        let id = far_job(api, &tenant).await;
        jobs.push((tenant, id));
    }
    for (tenant, id) in &jobs {
        let (status, job) = api.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(
            (status, job["tenant"].as_str()),
            (200, Some(tenant.as_str())),
            "{job}"
        );
        let (status, page) = api.get(&format!("/v1/jobs?tenant={tenant}")).await;
        assert_eq!(status, 200, "{page}");
        let listed: Vec<&str> = page["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j["id"].as_str())
            .collect();
        assert_eq!(listed, vec![id.as_str()], "{tenant}'s list");
        let (status, job) = api
            .post(&format!("/v1/jobs/{id}/pause"), &Value::Null)
            .await;
        assert_eq!(
            (status, job["state"].as_str()),
            (200, Some("paused")),
            "{job}"
        );
    }
    jobs
}

/// Fires a job now (its ticket waits on a queue nobody serves) and finds its ticket by id.
async fn a_ticket_is_found_by_id(api: &Api) -> Value {
    let job = api
        .create(
            &json!({"tenant": "ids-0", "name": "now", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "nobody"}}),
        )
        .await;
    let ticket = api.ticket_of_run(&job, "dispatched").await;
    assert_eq!(ticket["job_id"].as_str(), Some(job.as_str()), "{ticket}");
    let (status, body) = api
        .get("/v1/tickets/01890000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(status, 404, "{body}");
    ticket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_cluster_finds_jobs_from_their_ids_without_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let jobs = jobs_are_found_by_id_and_by_tenant(&api).await;
    // one tenant's ids end with the same routing key, and differ before it
    let mut same = Vec::new();
    for _ in 0..3 {
        same.push(far_job(&api, "ids-0").await);
    }
    assert!(
        same.iter().all(|id| id[32..] == jobs[0].1[32..]),
        "{same:?}"
    );
    assert!(same.windows(2).all(|w| w[0] < w[1]), "{same:?}");
    // an id nobody minted is not found, wherever it leads
    let (status, body) = api
        .get("/v1/jobs/01890000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(status, 404, "{body}");
    // a ticket carries its job's routing key, so it is looked up on one shard
    let ticket = a_ticket_is_found_by_id(&api).await;
    assert_eq!(
        ticket["ticket_id"].as_str().unwrap()[32..],
        jobs[0].1[32..],
        "{ticket}"
    );

    let js = async_nats::jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());
    let config = js.get_key_value(names::SHARDS_BUCKET).await.unwrap();
    let config: Value = serde_json::from_slice(
        &config
            .get(names::CLUSTER_CONFIG_KEY)
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(config["job_ids"], "tenant_key", "{config}");
    assert!(
        js.get_key_value(names::JOB_INDEX_BUCKET).await.is_err(),
        "a new cluster keeps no job index"
    );
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_from_an_earlier_version_keeps_its_job_index() {
    let dir = tempfile::tempdir().unwrap();
    // What an earlier version left in the data dir: a config without `job_ids`.
    let mut nats = chronoshard_natsd::Server::start(
        chronoshard_natsd::find().unwrap(),
        &chronoshard_natsd::Options::in_dir(&dir.path().join("nats")),
    )
    .await
    .unwrap();
    let cluster = chronoshard_cluster::Cluster::create(
        async_nats::connect(nats.url()).await.unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    cluster
        .js
        .get_key_value(names::SHARDS_BUCKET)
        .await
        .unwrap()
        .put(names::CLUSTER_CONFIG_KEY, r#"{"shard_count":8}"#.into())
        .await
        .unwrap();
    drop(cluster);
    nats.stop().await.unwrap();

    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let jobs = jobs_are_found_by_id_and_by_tenant(&api).await;
    a_ticket_is_found_by_id(&api).await;
    let js = async_nats::jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());
    let index = js.get_key_value(names::JOB_INDEX_BUCKET).await.unwrap();
    for (tenant, id) in &jobs {
        let entry = index.get(id).await.unwrap();
        assert_eq!(
            entry.as_deref(),
            Some(tenant.as_bytes()),
            "index entry of {id}"
        );
    }
    p.stop().await.unwrap();
}
