//! A client generated from the committed openapi/openapi.json by an off-the-shelf generator
//! (openapi-python-client, from PyPI) drives a running platform: create a job (and again with
//! its idempotency key), pause, resume and trigger it, read its runs and the triggered ticket,
//! and read a 404 as the problem document the spec promises. If the document and the API
//! disagreed, the generated code would fail to call or to parse.
//!
//! Needs `CHRONOSHARD_OPENAPI_PYTHONPATH`: where openapi-python-client is installed
//! (`scripts/test.sh` installs it into `.tools/openapi`).

use std::{path::Path, process::Command};

use crate::common::*;
use serde_json::Value;

fn generator_path() -> String {
    std::env::var("CHRONOSHARD_OPENAPI_PYTHONPATH").expect(
        "CHRONOSHARD_OPENAPI_PYTHONPATH names where openapi-python-client is installed: run \
         scripts/test.sh, or `. scripts/lib.sh && ensure_openapi_client`",
    )
}

/// Generates the package `chronoshard_client` into `dir` from the committed document.
fn generate(dir: &Path) {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json");
    let config = dir.join("generator.yaml");
    // No post hooks: the formatter they call is not needed to use the code.
    std::fs::write(&config, "post_hooks: []\n").unwrap();
    let out = Command::new("python3")
        .args(["-m", "openapi_python_client", "generate", "--meta", "none"])
        .arg("--path")
        .arg(&spec)
        .arg("--config")
        .arg(&config)
        .arg("--output-path")
        .arg(dir.join("chronoshard_client"))
        .env("PYTHONPATH", generator_path())
        .output()
        .expect("python3 runs");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the generator failed: {said}");
    // The generator carries on past schemas it cannot turn into models; that is a failure here.
    assert!(
        !said.contains("Unable to"),
        "the generator could not use the whole document: {said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_generated_client_creates_pauses_resumes_triggers_and_reads_runs_and_tickets() {
    let work = tempfile::tempdir().unwrap();
    generate(work.path());
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/generated_client/use_client.py");
    let path = format!("{}:{}", work.path().display(), generator_path());
    let (url, token) = (p.url.clone(), p.token.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([&url, &token])
            .env("PYTHONPATH", path)
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the generated client's run failed: {stderr}"
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        seen["states"],
        serde_json::json!(["paused", "active"]),
        "{seen}"
    );
    assert_eq!(seen["triggered"], "dispatched", "{seen}");
    assert_eq!(seen["ticket_job"], seen["job"], "{seen}");
    assert_eq!(seen["not_found_code"], "not_found", "{seen}");
    let runs = seen["runs"].as_array().unwrap();
    assert!(
        runs.iter().any(|s| s == "scheduled"),
        "the next occurrence: {seen}"
    );
    assert!(runs.len() >= 2, "{seen}");

    // What the generated client did is what the API holds.
    let api = Api::new(&p);
    let (status, job) = api
        .get(&format!("/v1/jobs/{}", seen["job"].as_str().unwrap()))
        .await;
    assert_eq!(
        (status, &job["state"], &job["tenant"]),
        (
            200,
            &serde_json::json!("active"),
            &serde_json::json!("generated")
        )
    );
    let (_, page) = api.get("/v1/jobs?tenant=generated").await;
    assert_eq!(
        page["jobs"].as_array().unwrap().len(),
        1,
        "one job for two creates with one key"
    );
    p.stop().await.unwrap();
}
