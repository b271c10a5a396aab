//! Talking to many sandboxes at once. Each guest answers on its own (and on PVM hosts
//! slowly: its kernel work is emulated), so waiting for them one after another wastes
//! the time they could overlap. A few threads share the list; results keep its order.

/// Runs `f` on every item with at most `workers` threads; `None` where a worker panicked.
pub fn map<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<Option<R>> {
    let workers = workers.clamp(1, items.len().max(1));
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn(move || (w..items.len()).step_by(workers).map(|i| (i, f(&items[i]))).collect::<Vec<_>>())
            })
            .collect();
        for h in handles {
            for (i, r) in h.join().unwrap_or_default() {
                out[i] = Some(r);
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_and_covers_every_item() {
        let items: Vec<u32> = (0..37).collect();
        let out = super::map(&items, 5, |x| x * 2);
        assert_eq!(out, items.iter().map(|x| Some(x * 2)).collect::<Vec<_>>());
        assert!(super::map(&Vec::<u32>::new(), 4, |x| *x).is_empty());
    }
}
