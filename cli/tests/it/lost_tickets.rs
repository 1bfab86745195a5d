//! Tickets JetStream acknowledged and then no longer holds, with no worker having started them:
//! the lost-ticket sweep sends them again (not while a result of theirs may be on its way), and
//! fails an attempt lost too often as `lost:`.

use chronoshard_wire::Dur;
use std::time::Duration;

use crate::common::{worker::HandWorker, *};
use async_nats::jetstream;
use chronoshard_wire::{names, ResultKind};
use serde_json::json;

async fn resent_total(api: &Api) -> u64 {
    api.metric_sum("chronoshard_tickets_resent_total").await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_ticket_is_sent_again_and_one_lost_too_often_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let p = platform_with(dir.path(), |o| {
        o.settings.resend_after = Dur(Duration::from_secs(1))
    })
    .await;
    let api = Api::new(&p);
    let js = jetstream::new(async_nats::connect(&p.nats_url).await.unwrap());

    // A worker ran a ticket and stored its result, but the shard has not applied it yet (its
    // results consumer is paused): the ticket left the stream without a `started`, yet it must
    // not be sent again.
    let done = api
        .create(
            &json!({"tenant": "acme", "name": "done", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "quick"}}),
        )
        .await;
    let mut quick = HandWorker::start(&p.nats_url, "quick").await;
    let ran = quick.next_ticket(LONG).await;
    let results = js.get_stream(names::RESULT_STREAM).await.unwrap();
    let consumer = names::result_consumer(ran.shard);
    let until = async_nats::datetime::add_std_duration(
        async_nats::datetime::now(),
        Duration::from_secs(300),
    )
    .unwrap();
    results.pause_consumer(&consumer, until).await.unwrap();
    quick.report(&ran, ResultKind::Succeeded, None).await;
    // a resend would come after 1 s + a quarter of it; give it four times that
    let again = tokio::time::timeout(Duration::from_secs(5), quick.next_ticket(LONG)).await;
    assert!(
        again.is_err(),
        "resent although its result was stored: {:?}",
        again.ok()
    );
    results.resume_consumer(&consumer).await.unwrap();
    let run = api.newest_run_succeeded(&done).await;
    assert_eq!(run["attempts"], 1, "{run}");
    assert_eq!(resent_total(&api).await, 0);

    let job = api
        .create(
            &json!({"tenant": "acme", "name": "fragile", "schedule": {"delay": "0s"},
            "target": {"type": "queue", "queue": "lossy"}}),
        )
        .await;

    // No worker consumes the queue yet: the ticket waits in the stream. Delete it there, as a
    // stream that lost it would.
    let stream = js.get_stream(names::DISPATCH_STREAM).await.unwrap();
    let subject = names::dispatch_subject("lossy");
    let stored = wait_for("the ticket to be stored", LONG, || async {
        stream.get_last_raw_message_by_subject(&subject).await.ok()
    })
    .await
    .unwrap();
    assert!(stream.delete_message(stored.sequence).await.unwrap());

    let mut hand = HandWorker::start(&p.nats_url, "lossy").await;
    let again = hand.next_ticket(LONG).await;
    let original: chronoshard_wire::Ticket = serde_json::from_slice(&stored.payload).unwrap();
    assert_eq!(
        (again.ticket_id, again.attempt),
        (original.ticket_id, 1),
        "the same ticket and attempt, not a new one"
    );
    hand.report(&again, ResultKind::Started, None).await;
    hand.report(&again, ResultKind::Succeeded, None).await;
    let run = api.newest_run_succeeded(&job).await;
    assert_eq!(run["attempts"], 1, "{run}");
    assert_eq!(resent_total(&api).await, 1);

    // A ticket that leaves the stream again and again is given up: after the first send and three
    // resends it fails as lost, and with one attempt allowed it is a dead letter.
    api.create(
        &json!({"tenant": "acme", "name": "unwanted", "schedule": {"delay": "0s"},
        "target": {"type": "queue", "queue": "picky"}}),
    )
    .await;
    // a worker that terminates every delivery of the ticket without a word
    let mut hand = HandWorker::start(&p.nats_url, "picky").await;
    let first = hand.reject_next(LONG).await;
    for resend in 1..=3 {
        let t = hand.reject_next(LONG).await;
        assert_eq!(
            (t.ticket_id, t.attempt),
            (first.ticket_id, 1),
            "resend {resend}"
        );
    }
    let letter = wait_for("the ticket to be a dead letter", LONG, || async {
        let (_, page) = api.get("/v1/dlq").await;
        page["items"].as_array()?.first().cloned()
    })
    .await
    .unwrap();
    assert_eq!(letter["ticket_id"], first.ticket_id.to_string().as_str());
    let error = letter["error"].as_str().unwrap();
    assert!(error.starts_with("lost: "), "{letter}");
    let (_, t) = api.get(&format!("/v1/tickets/{}", first.ticket_id)).await;
    assert_eq!(t["attempts"][0]["worker"], "sweep", "{t}");
    assert_eq!(resent_total(&api).await, 1 + 3);
    p.stop().await.unwrap();
}
