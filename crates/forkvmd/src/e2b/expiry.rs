//! E2B lifetimes: a running sandbox whose `endAt` passed is killed, or paused when it
//! was created with `autoPause` (E2B's documented behaviour). A paused one waits for a
//! connect, which gives it a new lifetime. Records of sandboxes that are gone (killed
//! through forkvm's own API, or whose VMM died) are dropped on the same tick.

use super::control::{kill_sandbox, seen, Seen};
use super::records;
use super::E2b;
use forkvm_sandbox::registry::now_unix_ms;
use std::time::Duration;

/// How often lifetimes are checked.
pub const PERIOD: Duration = Duration::from_millis(500);

/// One pass over the records.
pub async fn tick(e2b: &E2b) {
    let all = match records::all(&e2b.app.db()) {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!(%e, "reading the E2B sandboxes");
            return;
        }
    };
    let now = now_unix_ms();
    for rec in all {
        match seen(e2b, &rec.id) {
            Seen::Gone => {
                let _ = records::delete(&e2b.app.db(), &rec.id);
            }
            Seen::Running if rec.end_at_ms <= now => {
                let id = rec.id.clone();
                let outcome = if rec.auto_pause {
                    e2b.app.blocking(move |s| crate::lifecycle::pause_requested(&s, &id)).await.map(|_| "paused")
                } else {
                    kill_sandbox(e2b, &rec.id)
                        .await
                        .map(|()| "killed")
                        .map_err(|e| crate::error::ApiError::internal(e.message))
                };
                match outcome {
                    Ok(what) => tracing::info!(sandbox_id = %rec.id, what, "E2B lifetime ended"),
                    Err(e) => tracing::warn!(sandbox_id = %rec.id, error = %e.message, "ending an E2B lifetime"),
                }
            }
            _ => {}
        }
    }
}

/// Runs [`tick`] until the runtime stops.
pub async fn schedule(e2b: E2b) {
    let mut t = tokio::time::interval(PERIOD);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        tick(&e2b).await;
    }
}
