//! Sessions: one stream to one coordinator at a time, going round the worker's addresses.
//!
//! A session opens a channel with HTTP/2 keepalive (so a stream that dies silently, behind a
//! proxy say, is noticed within seconds), says hello (naming the tasks still running from an
//! earlier session, which the new coordinator adopts or cancels), sends heartbeats and takes
//! tasks until the stream ends. A lost stream is followed by the next address after a backoff;
//! a coordinator's goodbye (it is shutting down) by the next address at once.

use std::sync::Arc;
use std::time::Duration;

use baton_proto::connection::{ClientSecurity, Connection, with_sources};
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    Heartbeat, Hello, ResendTask, WorkerMessage, coordinator_message, worker_message,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::task::Origin;
use super::{AbortOnDrop, Worker, drain_message};
use crate::payload::PartCache;

/// A refused connection fails fast, so the worker moves on to the next address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings on an idle connection too: a stream only ever written to by the worker's
/// heartbeats would not otherwise notice that nothing answers any more.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a session ended other than by the coordinator's goodbye.
#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    #[error("not a valid coordinator address: {0}")]
    Address(String),
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("the coordinator refused the stream: {0}")]
    Refused(String),
    /// The coordinator does not let this worker in (its credentials, or an agent its principal
    /// may not serve): trying again cannot help.
    #[error("{0}")]
    Denied(Denied),
    #[error("the coordinator closed the stream")]
    Closed,
    #[error("the stream broke: {0}")]
    Broken(String),
}

/// The coordinator refused this worker for good, with its reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the coordinator refused this worker: {0}")]
pub struct Denied(pub String);

/// The coordinator is shutting down and said so: the worker connects to its next address at
/// once, keeping its tasks running.
pub(super) struct Goodbye;

impl Worker {
    /// Sessions, one after another, round the worker's addresses, until a coordinator refuses
    /// the worker's credentials.
    pub(super) async fn serve(self: Arc<Self>, slots: Arc<Semaphore>) -> Denied {
        let mut backoff = Backoff::new();
        for address in self.coordinators.iter().cycle() {
            let ended = self.session(address, &slots, &mut backoff).await;
            match &ended {
                Err(Error::Denied(denied)) => {
                    tracing::error!(worker_id = %self.id, coordinator = %address, error = %denied, "refused");
                    return denied.clone();
                }
                Ok(Goodbye) => {
                    tracing::info!(worker_id = %self.id, coordinator = %address, "the coordinator is shutting down; moving to the next one");
                }
                Err(error @ (Error::Connect(_) | Error::Refused(_))) => {
                    // A TLS mismatch fails as a bare "transport error": say what is wrong and
                    // which flag fixes it, found by a probe (only after a failure).
                    match baton_proto::diagnose::diagnose(address, &self.security).await {
                        Some(hint) => {
                            tracing::error!(worker_id = %self.id, coordinator = %address, %error, %hint, "cannot reach the coordinator")
                        }
                        None => {
                            tracing::warn!(worker_id = %self.id, coordinator = %address, %error, "lost the coordinator")
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(worker_id = %self.id, coordinator = %address, %error, "lost the coordinator");
                }
            }
            tokio::time::sleep(pause_after(&ended, &mut backoff)).await;
        }
        unreachable!("a worker always has a coordinator address")
    }

    /// One connection: hello, then tasks until the stream ends.
    async fn session(
        self: &Arc<Self>,
        address: &str,
        slots: &Arc<Semaphore>,
        backoff: &mut Backoff,
    ) -> Result<Goodbye, Error> {
        let channel = connect(address, &self.security).await?;
        let mut client = WorkerServiceClient::new(channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let (outbound, receiver) = mpsc::channel::<WorkerMessage>(1_024);
        outbound
            .send(self.hello())
            .await
            .map_err(|_| Error::Broken("the stream closed before the hello".to_owned()))?;
        let mut inbound = client
            .task_stream(ReceiverStream::new(receiver))
            .await
            .map_err(|status| match status.code() {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    Error::Denied(Denied(status.message().to_owned()))
                }
                _ => Error::Refused(status.message().to_owned()),
            })?
            .into_inner();
        backoff.reset();
        *self.current.lock().expect("session lock") = Some(outbound.clone());
        // A worker that reconnects while draining says so again on the new stream.
        if self.draining.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = outbound.send(drain_message()).await;
        }
        // Cleared when the session ends or is dropped: a sender left behind would keep the
        // stream open, and the coordinator would think this worker is still there.
        let _session = EndSession(self.clone());
        tracing::info!(worker_id = %self.id, coordinator = %address, "connected");
        self.metrics.session_opened();
        // Aborted when the session ends or is dropped (shutdown): the heartbeat holds a sender of
        // the stream, and a stream with a sender left open never closes on the coordinator's side.
        let _heartbeat = AbortOnDrop(
            tokio::spawn(heartbeat(
                outbound.clone(),
                slots.clone(),
                self.heartbeat_interval,
            ))
            .abort_handle(),
        );
        let origin = Origin {
            address: address.to_owned(),
            channel,
        };
        let mut cache = PartCache::new(self.part_cache_bytes);
        loop {
            let message = match inbound.message().await {
                Ok(Some(message)) => message,
                Ok(None) => return Err(Error::Closed),
                Err(status) => return Err(Error::Broken(status.message().to_owned())),
            };
            match message.message {
                Some(coordinator_message::Message::Task(mut task)) => {
                    // At once and in arrival order: the coordinator touched its copy of the
                    // cache in the order it sent the tasks.
                    let parts = std::mem::take(&mut task.parts);
                    let payload = match cache.receive(task.manifest.take(), parts) {
                        Ok(payload) => payload,
                        Err(error) => {
                            // The task is dropped here; the coordinator resets both caches and
                            // sends it again whole (or fails its step after a few tries).
                            tracing::warn!(task_id = %task.task_id, %error, "payload rejected; asking for it again");
                            let resend = WorkerMessage {
                                message: Some(worker_message::Message::Resend(ResendTask {
                                    task_id: task.task_id,
                                    reason: error.to_string(),
                                })),
                            };
                            if outbound.send(resend).await.is_err() {
                                return Err(Error::Broken("the stream closed".to_owned()));
                            }
                            continue;
                        }
                    };
                    let permit = slots.clone().acquire_owned().await.expect("never closed");
                    self.start(task, payload, origin.clone(), permit);
                }
                Some(coordinator_message::Message::Cancel(cancel)) => {
                    // Dropping the task drops its agent: a handler's future, a command's process
                    // (killed on drop), and the slot it held.
                    let handle = self
                        .running
                        .lock()
                        .expect("running lock")
                        .remove(&cancel.task_id);
                    if let Some(handle) = handle {
                        handle.abort();
                        tracing::info!(task_id = %cancel.task_id, reason = %cancel.reason, "task cancelled; agent stopped");
                    }
                }
                Some(coordinator_message::Message::ResetPartCache(_)) => {
                    cache = PartCache::new(self.part_cache_bytes);
                }
                Some(coordinator_message::Message::Rejected(rejected)) => {
                    tracing::warn!(task_id = %rejected.task_id, reason = %rejected.message, "result rejected");
                }
                // Returning drops this session's sender of the stream (the heartbeat's too), so
                // the stream closes; the tasks running carry on and answer on the next one.
                Some(coordinator_message::Message::Goodbye(_)) => return Ok(Goodbye),
                None => {}
            }
        }
    }

    fn hello(&self) -> WorkerMessage {
        let held: Vec<String> = self
            .running
            .lock()
            .expect("running lock")
            .keys()
            .cloned()
            .collect();
        WorkerMessage {
            message: Some(worker_message::Message::Hello(Hello {
                worker_id: self.id.clone(),
                agents: self.agents.keys().cloned().collect(),
                // All of it: the held tasks the coordinator adopts count against it there, and
                // those it does not it cancels, which frees their slots here.
                capacity: self.concurrency.try_into().unwrap_or(u32::MAX),
                cache_bytes: self.part_cache_bytes,
                protocol: baton_proto::WORKER_PROTOCOL,
                held,
            })),
        }
    }
}

async fn connect(address: &str, security: &ClientSecurity) -> Result<Connection, Error> {
    let endpoint = security
        .endpoint(address)
        .map_err(|error| Error::Address(error.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| Error::Connect(with_sources(&error)))?;
    security
        .authorize(channel)
        .map_err(|error| Error::Address(error.to_string()))
}

/// Tells the coordinator, every `interval`, that the worker is alive and how many slots it
/// has free; ends when the stream does.
async fn heartbeat(
    outbound: mpsc::Sender<WorkerMessage>,
    slots: Arc<Semaphore>,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let beat = WorkerMessage {
            message: Some(worker_message::Message::Heartbeat(Heartbeat {
                free_capacity: slots.available_permits().try_into().unwrap_or(u32::MAX),
            })),
        };
        if outbound.send(beat).await.is_err() {
            return;
        }
    }
}

/// How long to wait before the next session: not at all after a goodbye, where the
/// coordinator leaves on purpose and its tasks' answers are awaited elsewhere; a growing
/// backoff after a failure, so that a cluster that is down is not hammered.
fn pause_after(ended: &Result<Goodbye, Error>, backoff: &mut Backoff) -> Duration {
    match ended {
        Ok(Goodbye) => Duration::ZERO,
        Err(_) => backoff.next(),
    }
}

/// Forgets the session's stream when dropped.
struct EndSession(Arc<Worker>);

impl Drop for EndSession {
    fn drop(&mut self) {
        if let Ok(mut current) = self.0.current.lock() {
            *current = None;
        }
        self.0.metrics.session_closed();
    }
}

/// 100 ms doubling to 5 s, reset by a successful connection.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Self { next: Self::FIRST }
    }

    fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut backoff = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| backoff.next().as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(100));
    }

    #[test]
    fn a_goodbye_is_followed_at_once_and_a_failure_after_a_backoff() {
        let mut backoff = Backoff::new();
        assert_eq!(
            pause_after(&Err(Error::Closed), &mut backoff),
            Duration::from_millis(100)
        );
        assert_eq!(pause_after(&Ok(Goodbye), &mut backoff), Duration::ZERO);
        assert_eq!(
            pause_after(&Err(Error::Closed), &mut backoff),
            Duration::from_millis(200),
            "a goodbye leaves the backoff as it was"
        );
    }
}
