//! The `workflows` verbs of the built binary against a dev platform: a workflow created from a
//! TOML file, listed, shown with its steps, triggered, its runs and one run read, a failed run
//! retried, pause, resume and delete, and the exit codes of what the API refuses.

use crate::{
    client_verbs::{Cli, UNKNOWN},
    common::*,
};
use serde_json::Value;

/// `a → b` calling the sink, and `c` calling a closed port (so it dies at its one attempt).
fn etl_toml(sink: &HttpSink) -> String {
    format!(
        r#"
tenant = "acme"
name = "etl"
schedule = {{ cron = "0 0 1 1 *" }}

[[steps]]
name = "a"
target = {{ type = "http", url = "{a}" }}

[[steps]]
name = "b"
after = ["a"]
target = {{ type = "http", url = "{b}" }}

[[steps]]
name = "c"
target = {{ type = "http", url = "http://127.0.0.1:1/closed" }}
"#,
        a = sink.url("/a"),
        b = sink.url("/b"),
    )
}

async fn newest_run(cli: &Cli<'_>, id: &str, ended: &str) -> Value {
    wait_for("the run to end", LONG, || async {
        let page = cli.json(&["workflows", "runs", id]).await;
        page["runs"]
            .get(0)
            .filter(|r| r["status"] == ended)
            .cloned()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workflows_are_created_read_run_retried_and_deleted_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let cli = Cli::new(&p);
    let sink = HttpSink::start().await.unwrap();
    let file = dir.path().join("etl.toml");
    std::fs::write(&file, etl_toml(&sink)).unwrap();
    let made = cli
        .json(&["workflows", "create", "-f", file.to_str().unwrap()])
        .await;
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(made["steps"][1]["after"][0], "a", "{made}");

    let shown = cli.run(&["workflows", "get", &id]).await.ok().stdout;
    for words in ["fail fast:", "STEP", "AFTER", "http POST"] {
        assert!(shown.contains(words), "{words} in {shown}");
    }
    let listed = cli
        .run(&["workflows", "list", "--tenant", "acme"])
        .await
        .ok()
        .stdout;
    assert!(listed.contains(&id) && listed.contains("STEPS"), "{listed}");

    let triggered = cli.json(&["workflows", "trigger", &id]).await;
    assert_eq!(triggered["job_id"], id.as_str(), "{triggered}");
    let run = newest_run(&cli, &id, "dead").await;
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let table = cli.run(&["workflows", "runs", &id]).await.ok().stdout;
    assert!(table.contains("2 succeeded, 1 dead"), "{table}");
    let one = cli.json(&["workflows", "run", &run_id]).await;
    assert_eq!(one, run);
    let detail = cli.run(&["workflows", "run", &run_id]).await.ok().stdout;
    assert!(
        detail.contains("REASON") && detail.contains("dead"),
        "{detail}"
    );

    // A retry runs c again (it dies again: the port is still closed).
    let retried = cli.json(&["workflows", "retry", &run_id]).await;
    assert_eq!(retried["run_id"], run_id.as_str());
    let run = wait_for("c's second attempt to end", LONG, || async {
        let r = cli.json(&["workflows", "run", &run_id]).await;
        let c = r["steps"][2].clone();
        (c["attempts"].as_array()?.len() == 2 && r["status"] == "dead").then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(run["steps"][0]["attempts"].as_array().unwrap().len(), 1);

    // Refusals keep their exit codes: 404 → 3, 409 → 4, a bad file → 2.
    cli.run(&["workflows", "get", UNKNOWN]).await.failed(3, "");
    std::fs::write(
        &file,
        "tenant = \"acme\"\nname = \"x\"\nschedule = { every = \"1h\" }\nsteps = []\n",
    )
    .unwrap();
    cli.run(&["workflows", "create", "-f", file.to_str().unwrap()])
        .await
        .failed(2, "");
    let paused = cli.json(&["workflows", "pause", &id]).await;
    assert_eq!(paused["state"], "paused");
    let resumed = cli.json(&["workflows", "resume", &id]).await;
    assert_eq!(resumed["state"], "active");
    cli.run(&["workflows", "delete", &id]).await.ok();
    let gone = cli.json(&["workflows", "get", &id]).await;
    assert_eq!(gone["state"], "deleted");
    cli.run(&["workflows", "pause", &id]).await.failed(4, "");
    p.stop().await.unwrap();
}
