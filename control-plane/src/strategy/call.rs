//! Running one strategy call on a thread of its own under a deadline. The caller awaits a
//! oneshot with a timeout, so a strategy that hangs costs a parked thread, never a blocked
//! runtime worker; the thread is left to finish (or not) on its own, since a thread cannot be
//! killed safely. Deciding what a timeout means (disabling the strategy) is the registry's job.

use std::{thread, time::Duration};

use tokio::sync::oneshot;

use super::Error;

/// Runs `work` on a new thread named after the strategy and waits for it up to `deadline`.
pub async fn on_thread<T, F>(name: &str, deadline: Duration, work: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    thread::Builder::new()
        .name(format!("strategy-{name}"))
        .spawn(move || {
            // The caller may have given up already; then nobody wants the answer.
            let _ = tx.send(work());
        })
        .map_err(|source| Error::Spawn {
            name: name.to_string(),
            source,
        })?;
    match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(_)) => Err(Error::Lost {
            name: name.to_string(),
        }),
        Err(_) => Err(Error::Timeout {
            name: name.to_string(),
            deadline,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[tokio::test]
    async fn an_answer_in_time_comes_back() {
        let answer = on_thread("quick", Duration::from_secs(5), || 7).await;
        assert_eq!(answer.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_a_timeout_while_the_thread_still_runs() {
        let (release, wait) = mpsc::channel::<()>();
        let stuck = on_thread("stuck", Duration::from_millis(50), move || {
            wait.recv().is_ok()
        });
        assert!(matches!(stuck.await, Err(Error::Timeout { .. })));
        // The thread is still parked on `wait`; letting it go ends it.
        release.send(()).unwrap();
    }

    #[tokio::test]
    async fn a_thread_that_dies_without_answering_is_lost() {
        let lost = on_thread("dies", Duration::from_secs(5), || -> u8 {
            panic!("host bug")
        });
        assert!(matches!(lost.await, Err(Error::Lost { .. })));
    }
}
