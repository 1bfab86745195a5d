//! A shard's pull of its results that ends is opened again, its consumer with it: the results
//! workers store meanwhile are applied, and the renewal is counted
//! (`chronoshard_result_pulls_renewed_total`). A pull that goes silent (a missed heartbeat) takes
//! the same path after it; no way was found to make a real server drop a pull without a word (a
//! paused consumer still sends heartbeats), so for that trigger only the classification of the
//! error is tested (`shard::results` unit tests), not the renewal that follows it.

use crate::common::{worker::HandWorker, *};
use async_nats::jetstream;
use chronoshard_wire::{names, ResultKind};
use serde_json::json;

async fn renewed(api: &Api) -> u64 {
    api.metric_sum("chronoshard_result_pulls_renewed_total")
        .await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_pull_that_ends_is_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform(dir.path()).await;
    let api = Api::new(&p);
    let js = jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());
    let results = js.get_stream(names::RESULT_STREAM).await.unwrap();
    let mut hand = HandWorker::start(&p.nats_url, "pulled").await;

    // The shard's results consumer is deleted under it (by an operator, or a stream reset): the
    // server ends the pull, and the shard creates the consumer again.
    let job = api
        .create(
            &json!({"tenant": "acme", "name": "pulled", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "pulled"}}),
        )
        .await;
    let ticket = hand.next_ticket(LONG).await;
    let consumer = names::result_consumer(ticket.shard);
    assert_eq!(renewed(&api).await, 0);
    results.delete_consumer(&consumer).await.unwrap();
    wait_for("the pull to be renewed", LONG, || async {
        (renewed(&api).await >= 1).then_some(())
    })
    .await
    .unwrap();
    hand.report(&ticket, ResultKind::Succeeded, None).await;
    let run = api.newest_run_succeeded(&job).await;
    assert_eq!(run["attempts"], 1, "{run}");
    assert_eq!(
        api.metric_sum_with("chronoshard_result_pulls_renewed_total", "reason=\"ended\"")
            .await,
        1.0,
        "the server ended the pull"
    );
}
