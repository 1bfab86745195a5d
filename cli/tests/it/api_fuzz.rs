//! The API fuzzed from its own OpenAPI document (schemathesis, from PyPI) against a running
//! platform: for every operation, inputs generated from the committed openapi/openapi.json, valid
//! and invalid, and sequences that follow the document's links (create a job, then act on it).
//! No answer may be a 5xx, every answer must match the document (status, content type, body
//! schema, headers), and input the document forbids must be refused.
//!
//! One check is left out: that every input the schema allows is accepted. A JSON schema cannot
//! say that a cron expression must parse, that a time zone must exist, or that `cron` and
//! `every` of a preview exclude each other, so the generator's schema-valid nonsense is rightly
//! refused. The operations that change the cluster itself (settings, strategy, plugins, drains)
//! are left out too: a fuzzed setting would stop the platform under the test; their own tests
//! cover their refusals.
//!
//! Needs `CHRONOSHARD_FUZZ_PYTHONPATH`: where schemathesis is installed (`scripts/test.sh`
//! installs it into `.tools/fuzz`).

use std::{path::Path, process::Command};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_answers_what_its_document_promises_to_generated_input() {
    let fuzz = std::env::var("CHRONOSHARD_FUZZ_PYTHONPATH").expect(
        "CHRONOSHARD_FUZZ_PYTHONPATH names where schemathesis is installed: run scripts/test.sh, \
         or `. scripts/lib.sh && ensure_schemathesis`",
    );
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json");
    let reports = tempfile::tempdir().unwrap();
    let (url, auth) = (p.url.clone(), format!("Authorization: Bearer {}", p.token));
    let out =
        tokio::task::spawn_blocking(move || {
            Command::new("python3")
            .args(["-m", "schemathesis.cli", "run"])
            .arg(&spec)
            .args(["--url", &url, "-H", &auth])
            .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
            .args(["--max-examples", "25", "--generation-deterministic"])
            .args([
                "--exclude-path-regex",
                "^/v1/(settings|strategy|plugins|nodes/[^/]+/(drain|undrain)|workers/[^/]+/drain)",
            ])
            .arg("--report-dir")
            .arg(reports.path())
            // Its cache of crashes found goes to the working directory: a temp one, not cli/.
            .current_dir(reports.path())
            .env("PYTHONPATH", fuzz)
            .env("SCHEMATHESIS_HOOKS", "")
            .env("NO_COLOR", "1")
            .output()
            .expect("python3 runs")
        })
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found answers the document does not promise:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It really ran: operations tested, cases generated, none failed.
    let summary = said.rsplit("SUMMARY").next().unwrap_or_default();
    let tested: u32 = summary
        .split("Tested: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(tested >= 20, "{summary}");
    assert!(summary.contains("passed"), "{summary}");
    eprintln!("{summary}");
    p.stop().await.unwrap();
}
