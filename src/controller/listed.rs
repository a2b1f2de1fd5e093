//! Whether a watch has listed once, for any number of waiters.
//!
//! kube's `Store::wait_until_ready` keeps one waker: of several tasks waiting at once, only
//! the last to poll is woken when the store is ready, and the others hang until something
//! else wakes them. A store that only the controller's own runner waits for is fine; one that
//! every reconcile waits for (a store of another kind) needs this instead.

use tokio::sync::watch;

/// Marks the watch as listed; dropping it before that releases the waiters with an error.
pub struct MarkListed(watch::Sender<bool>);

/// Waits until the watch has listed.
#[derive(Clone)]
pub struct Listed(watch::Receiver<bool>);

/// The watch stopped before it listed.
#[derive(Debug, thiserror::Error)]
#[error("the watch stopped before it listed")]
pub struct NeverListed;

pub fn listed() -> (MarkListed, Listed) {
    let (sender, receiver) = watch::channel(false);
    (MarkListed(sender), Listed(receiver))
}

impl MarkListed {
    pub fn mark(&self) {
        self.0.send_replace(true);
    }
}

impl Listed {
    pub async fn wait(&self) -> Result<(), NeverListed> {
        let mut receiver = self.0.clone();
        receiver
            .wait_for(|listed| *listed)
            .await
            .map(|_| ())
            .map_err(|_| NeverListed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_is_released_when_the_watch_lists() {
        let (mark, listed) = listed();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let listed = listed.clone();
                tokio::spawn(async move { listed.wait().await.is_ok() })
            })
            .collect();
        // Every waiter is parked before the mark.
        tokio::task::yield_now().await;
        mark.mark();
        for waiter in waiters {
            let released = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("every waiter is woken");
            assert!(released.expect("the waiter ran"));
        }
    }

    #[tokio::test]
    async fn waiters_learn_that_the_watch_stopped() {
        let (mark, listed) = listed();
        drop(mark);
        assert!(listed.wait().await.is_err());
    }
}
