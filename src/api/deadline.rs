//! The request timeout's clock (`limits.request_timeout_ms`): a request
//! past its deadline is woken by one sweeper thread for the whole process,
//! not by a tokio timer of its own.
//!
//! A tokio timer per request (`tokio::time::timeout`) registers an entry in
//! the runtime's timer wheel, polls it at every poll of the request and
//! takes it out of the wheel again when the answer is ready: about 1,000
//! instructions per create at 64 connections (issue 28), for a deadline
//! that almost never passes. Here a request that is still pending after its
//! first poll puts its deadline and waker in a slot of one shared table
//! (one uncontended lock), compares the clock with its deadline at each
//! later poll, and frees its slot when it ends. The sweeper thread wakes
//! every [`TICK`] while requests are pending (it sleeps on a condition
//! variable while none is) and wakes the requests whose deadline has
//! passed; their next poll answers the timeout. A request therefore times
//! out at its deadline or at most one tick after it, never before.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How often the sweeper looks for requests past their deadline while any
/// is pending: how late, at most, a timeout is answered.
pub const TICK: Duration = Duration::from_millis(10);

/// The deadline ran out before the request's answer was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `future` until it is ready or `limit` has passed since this call:
/// `Err(Elapsed)` then (the future is dropped with the returned one).
pub fn within<F: Future + Unpin>(limit: Duration, future: F) -> Within<F> {
    Within {
        future,
        deadline: Instant::now().checked_add(limit),
        slot: None,
    }
}

/// The future of [`within`].
pub struct Within<F> {
    future: F,
    /// `None`: so far away that it cannot be represented (never runs out).
    deadline: Option<Instant>,
    /// The table slot and the waker stored in it, once pending.
    slot: Option<(usize, Waker)>,
}

impl<F: Future + Unpin> Future for Within<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(output) = Pin::new(&mut this.future).poll(cx) {
            return Poll::Ready(Ok(output));
        }
        let Some(deadline) = this.deadline else {
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            return Poll::Ready(Err(Elapsed));
        }
        match &mut this.slot {
            None => {
                let waker = cx.waker().clone();
                let index = table().insert(deadline, waker.clone());
                this.slot = Some((index, waker));
            }
            // The same task polls again (the usual case): nothing to do.
            Some((_, stored)) if stored.will_wake(cx.waker()) => {}
            Some((index, stored)) => {
                *stored = cx.waker().clone();
                table().replace_waker(*index, stored.clone());
            }
        }
        Poll::Pending
    }
}

impl<F> Drop for Within<F> {
    fn drop(&mut self) {
        if let Some((index, _)) = self.slot.take() {
            table().remove(index);
        }
    }
}

/// The pending requests' deadlines and wakers.
struct Table {
    state: Mutex<State>,
    /// Signalled when the first request is put in an empty table.
    work: Condvar,
}

#[derive(Default)]
struct State {
    /// Slots; `None` is free. A slot whose waker was taken has been woken
    /// (its deadline passed) and waits for its request to free it.
    slots: Vec<Option<(Instant, Option<Waker>)>>,
    /// Free slot indices.
    free: Vec<usize>,
    /// Slots in use.
    used: usize,
    /// The sweeper waits for work (the table was empty at its last look).
    idle: bool,
}

/// The process's table, its sweeper thread started on first use.
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("spark-deadlines".into())
            .spawn(|| table().sweep());
        if let Err(e) = spawned {
            // Without the sweeper no request would ever time out.
            panic!("the request timeout's sweeper thread did not start: {e}");
        }
        Table {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
        }
    })
}

impl Table {
    fn insert(&self, deadline: Instant, waker: Waker) -> usize {
        let mut state = self.state.lock();
        let entry = Some((deadline, Some(waker)));
        let index = match state.free.pop() {
            Some(index) => {
                state.slots[index] = entry;
                index
            }
            None => {
                state.slots.push(entry);
                state.slots.len() - 1
            }
        };
        state.used += 1;
        if state.idle {
            state.idle = false;
            self.work.notify_one();
        }
        index
    }

    fn replace_waker(&self, index: usize, waker: Waker) {
        if let Some((_, stored @ Some(_))) = &mut self.state.lock().slots[index] {
            *stored = Some(waker);
        }
    }

    fn remove(&self, index: usize) {
        let mut state = self.state.lock();
        state.slots[index] = None;
        state.free.push(index);
        state.used -= 1;
    }

    /// The sweeper: every [`TICK`] while requests are pending, wakes those
    /// past their deadline (once each); waits for work while none is.
    fn sweep(&self) {
        let mut due = Vec::new();
        loop {
            {
                let mut state = self.state.lock();
                while state.used == 0 {
                    state.idle = true;
                    self.work.wait(&mut state);
                }
                let now = Instant::now();
                for (deadline, waker) in state.slots.iter_mut().flatten() {
                    if *deadline <= now {
                        if let Some(waker) = waker.take() {
                            due.push(waker);
                        }
                    }
                }
            }
            for waker in due.drain(..) {
                waker.wake();
            }
            std::thread::sleep(TICK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that is never ready.
    struct Never;

    impl Future for Never {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_pending_future_times_out_at_its_deadline_and_not_before() {
        let started = Instant::now();
        assert_eq!(within(Duration::from_millis(50), Never).await, Err(Elapsed));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test]
    async fn a_ready_future_is_answered_and_frees_its_slot() {
        let (send, receive) = tokio::sync::oneshot::channel::<u32>();
        let waiting = tokio::spawn(within(Duration::from_secs(60), receive));
        tokio::time::sleep(Duration::from_millis(20)).await;
        send.send(7).unwrap();
        assert_eq!(waiting.await.unwrap(), Ok(Ok(7)));
        assert_eq!(
            within(Duration::from_secs(1), std::future::ready(3)).await,
            Ok(3)
        );
    }

    #[tokio::test]
    async fn many_deadlines_each_run_out() {
        let limits = [30u64, 10, 60, 20];
        let all = limits.map(|ms| tokio::spawn(within(Duration::from_millis(ms), Never)));
        for (task, ms) in all.into_iter().zip(limits) {
            let started = Instant::now();
            assert_eq!(task.await.unwrap(), Err(Elapsed), "{ms} ms");
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }
}
