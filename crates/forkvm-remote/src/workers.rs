//! Bounded parallel transfers: a few threads over a list, the first error stopping the rest.

use crate::push::jobs;
use crate::RemoteError;
use std::sync::Mutex;

/// Runs `each` over `items` on a few threads; the first error wins.
pub(crate) fn parallel<T: Sync>(
    items: &[T],
    each: impl Fn(&T) -> Result<u64, RemoteError> + Sync,
) -> Result<u64, RemoteError> {
    let next = Mutex::new(items.iter());
    let total = std::sync::atomic::AtomicU64::new(0);
    let failure: Mutex<Option<RemoteError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs().min(items.len().max(1)) {
            s.spawn(|| loop {
                if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    return;
                }
                let Some(item) = next.lock().unwrap_or_else(|p| p.into_inner()).next() else { return };
                match each(item) {
                    Ok(n) => {
                        total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => {
                        failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                    }
                }
            });
        }
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(total.into_inner()),
    }
}
