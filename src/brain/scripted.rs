//! The `scripted` brain, for tests (DESIGN.md "Brains").
//!
//! A [`ScriptedBrain`] answers with a fixed text, echoes the moment's text, or
//! fails with a fixed message, and counts how often it was asked. It can wait
//! a fixed time before answering (to exercise the engine's timeout or a
//! long poll) and can be *gated*: every call then waits until the test
//! releases it, so a turn can be held `running` for as long as the test
//! needs.
//!
//! ```
//! # use spark_engine::brain::{Brain, BrainRequest, scripted::ScriptedBrain};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let brain = ScriptedBrain::answering("Emergency exit.").gated();
//! let handle = brain.clone(); // shares the counter and the gate
//! let call = tokio::spawn(async move { brain.read(BrainRequest::default()).await });
//! handle.wait_for_calls(1).await; // the turn is now held `running`
//! handle.release(1);
//! assert_eq!(call.await.unwrap().unwrap().text, "Emergency exit.");
//! assert_eq!(handle.calls(), 1);
//! # });
//! ```
//!
//! Clones share all state, so a test keeps one clone and hands another (as
//! `Arc<dyn Brain>`) to the engine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{Notify, Semaphore};

use super::{Brain, BrainAnswer, BrainError, BrainRequest};

/// The adapter name the scripted brain puts on its answers.
pub const ADAPTER: &str = "scripted";

/// What a [`ScriptedBrain`] does once it is let through (after its gate and
/// delay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScriptedOutcome {
    /// Answer with this text (source `scripted`).
    Answer(String),
    /// Answer with `echo: <moment text>` (source `text`); `echo: ` alone when
    /// the moment has no text.
    Echo,
    /// Fail with this message.
    Fail(String),
}

#[derive(Debug)]
struct Inner {
    calls: AtomicUsize,
    finished: AtomicUsize,
    called: Notify,
    outcome: Mutex<ScriptedOutcome>,
    delay: Mutex<Option<Duration>>,
    gate: Mutex<Option<Arc<Semaphore>>>,
    requests: Mutex<Vec<BrainRequest>>,
}

/// A brain for tests; see the [module docs](self). Cheap to clone; clones
/// share the counters, the outcome, the delay and the gate.
#[derive(Clone, Debug)]
pub struct ScriptedBrain {
    inner: Arc<Inner>,
}

impl ScriptedBrain {
    /// A brain with this outcome, no delay, no gate.
    pub fn new(outcome: ScriptedOutcome) -> Self {
        ScriptedBrain {
            inner: Arc::new(Inner {
                calls: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
                called: Notify::new(),
                outcome: Mutex::new(outcome),
                delay: Mutex::new(None),
                gate: Mutex::new(None),
                requests: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A brain that answers `text`.
    pub fn answering(text: impl Into<String>) -> Self {
        Self::new(ScriptedOutcome::Answer(text.into()))
    }

    /// A brain that answers `echo: <moment text>`.
    pub fn echo() -> Self {
        Self::new(ScriptedOutcome::Echo)
    }

    /// A brain that fails with `message`.
    pub fn failing(message: impl Into<String>) -> Self {
        Self::new(ScriptedOutcome::Fail(message.into()))
    }

    /// This brain, waiting `delay` before each answer (after the gate).
    pub fn with_delay(self, delay: Duration) -> Self {
        self.set_delay(Some(delay));
        self
    }

    /// This brain, gated: every call waits until [`release`](Self::release)
    /// lets it through or [`open`](Self::open) opens the gate. Affects all
    /// clones; calls already past the gate are not held.
    pub fn gated(self) -> Self {
        *lock(&self.inner.gate) = Some(Arc::new(Semaphore::new(0)));
        self
    }

    /// Lets `n` more calls through the gate (calls waiting now or later). No
    /// effect on an ungated brain.
    pub fn release(&self, n: usize) {
        if let Some(gate) = lock(&self.inner.gate).as_ref() {
            gate.add_permits(n);
        }
    }

    /// Opens the gate for good: every waiting and future call goes through.
    pub fn open(&self) {
        if let Some(gate) = lock(&self.inner.gate).as_ref() {
            gate.close();
        }
    }

    /// Changes what the brain does from now on (calls held at the gate or in
    /// their delay use the new outcome too).
    pub fn set_outcome(&self, outcome: ScriptedOutcome) {
        *lock(&self.inner.outcome) = outcome;
    }

    /// The current outcome.
    pub fn outcome(&self) -> ScriptedOutcome {
        lock(&self.inner.outcome).clone()
    }

    /// Changes the delay before each answer (`None`: no delay) for calls not
    /// yet past the gate.
    pub fn set_delay(&self, delay: Option<Duration>) {
        *lock(&self.inner.delay) = delay;
    }

    /// How many times the brain was asked (counted as soon as a call starts,
    /// before the gate and the delay).
    pub fn calls(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// How many calls ran to their outcome (answered or failed; calls dropped
    /// while waiting, e.g. by a timeout, are not counted).
    pub fn finished(&self) -> usize {
        self.inner.finished.load(Ordering::SeqCst)
    }

    /// The requests the brain was asked, oldest first.
    pub fn requests(&self) -> Vec<BrainRequest> {
        lock(&self.inner.requests).clone()
    }

    /// Waits until the brain has been asked at least `n` times. Wrap it in a
    /// `tokio::time::timeout` in tests.
    pub async fn wait_for_calls(&self, n: usize) {
        loop {
            let notified = self.inner.called.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.calls() >= n {
                return;
            }
            notified.await;
        }
    }

    async fn answer(&self, request: BrainRequest) -> Result<BrainAnswer, BrainError> {
        let moment_text = request.moment_text.clone().unwrap_or_default();
        lock(&self.inner.requests).push(request);
        self.inner.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.called.notify_waiters();

        let gate = lock(&self.inner.gate).clone();
        if let Some(gate) = gate {
            // A closed gate (`open`) lets everything through.
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        let delay = *lock(&self.inner.delay);
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let outcome = self.outcome();
        self.inner.finished.fetch_add(1, Ordering::SeqCst);
        match outcome {
            ScriptedOutcome::Answer(text) => Ok(BrainAnswer {
                text,
                adapter: ADAPTER.into(),
                source: "scripted".into(),
            }),
            ScriptedOutcome::Echo => Ok(BrainAnswer {
                text: format!("echo: {moment_text}"),
                adapter: ADAPTER.into(),
                source: "text".into(),
            }),
            ScriptedOutcome::Fail(message) => Err(BrainError(message)),
        }
    }
}

impl Brain for ScriptedBrain {
    fn read(&self, request: BrainRequest) -> BoxFuture<'_, Result<BrainAnswer, BrainError>> {
        Box::pin(self.answer(request))
    }
}

/// Locks a mutex, ignoring poisoning (a panicking test must not hide the
/// state from the others).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(text: &str) -> BrainRequest {
        BrainRequest {
            moment_text: Some(text.into()),
            mode: "practical".into(),
            ..BrainRequest::default()
        }
    }

    #[tokio::test]
    async fn answers_fails_and_counts() {
        let brain = ScriptedBrain::answering("hello");
        let a = brain.read(req("x")).await.unwrap();
        assert_eq!((a.text.as_str(), a.adapter.as_str()), ("hello", "scripted"));
        brain.set_outcome(ScriptedOutcome::Fail("boom".into()));
        assert_eq!(brain.read(req("y")).await.unwrap_err().0, "boom");
        brain.set_outcome(ScriptedOutcome::Echo);
        assert_eq!(brain.read(req("z")).await.unwrap().text, "echo: z");
        assert_eq!(brain.calls(), 3);
        assert_eq!(brain.finished(), 3);
        let texts: Vec<_> = brain
            .requests()
            .into_iter()
            .filter_map(|r| r.moment_text)
            .collect();
        assert_eq!(texts, ["x", "y", "z"]);
        assert_eq!(
            ScriptedBrain::failing("no")
                .read(req("a"))
                .await
                .unwrap_err()
                .0,
            "no"
        );
    }

    #[tokio::test]
    async fn gate_holds_calls_until_released() {
        let brain = ScriptedBrain::answering("ok").gated();
        let shared: Arc<dyn Brain> = Arc::new(brain.clone());
        let first = tokio::spawn({
            let b = shared.clone();
            async move { b.read(req("1")).await }
        });
        let second = tokio::spawn({
            let b = shared.clone();
            async move { b.read(req("2")).await }
        });
        tokio::time::timeout(Duration::from_secs(5), brain.wait_for_calls(2))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(brain.finished(), 0);
        brain.release(1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(brain.finished(), 1);
        brain.open();
        assert_eq!(first.await.unwrap().unwrap().text, "ok");
        assert_eq!(second.await.unwrap().unwrap().text, "ok");
        // An open gate stays open.
        assert!(brain.read(req("3")).await.is_ok());
        assert_eq!(brain.calls(), 3);
    }

    #[tokio::test]
    async fn delay_trips_a_timeout() {
        let brain = ScriptedBrain::answering("late").with_delay(Duration::from_millis(300));
        let r = tokio::time::timeout(Duration::from_millis(50), brain.read(req("x"))).await;
        assert!(r.is_err());
        assert_eq!((brain.calls(), brain.finished()), (1, 0));
        brain.set_delay(None);
        assert_eq!(brain.read(req("x")).await.unwrap().text, "late");
    }
}
