//! Configuring a worker: where its coordinators are, what it serves, how it paces itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{AgentResult, Handler, Observer, Task, Worker};
use crate::{Failure, Output};

pub struct WorkerBuilder {
    id: Option<String>,
    coordinators: Vec<String>,
    concurrency: usize,
    part_cache_bytes: u64,
    heartbeat_interval: Duration,
    agents: BTreeMap<String, Handler>,
    observer: Option<Observer>,
    shutdown_grace: Duration,
    traces: bool,
    security: baton_proto::connection::ClientSecurity,
}

impl Worker {
    /// 256 MiB of payload parts: a 200-step run of 1 MiB results is sent to a worker once.
    pub const DEFAULT_PART_CACHE_BYTES: u64 = 256 << 20;

    /// Often enough that a coordinator notices a silent worker within a few seconds.
    pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            id: None,
            coordinators: vec!["http://127.0.0.1:50051".into()],
            concurrency: 4,
            part_cache_bytes: Self::DEFAULT_PART_CACHE_BYTES,
            heartbeat_interval: Self::DEFAULT_HEARTBEAT_INTERVAL,
            agents: BTreeMap::new(),
            observer: None,
            shutdown_grace: Duration::from_secs(30),
            traces: false,
            security: Default::default(),
        }
    }
}

impl WorkerBuilder {
    /// How to reach the coordinators: TLS roots, a client certificate, a token.
    pub fn security(mut self, security: baton_proto::connection::ClientSecurity) -> Self {
        self.security = security;
        self
    }

    /// The worker's id; defaults to `<host>-<pid>`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The coordinator's URL, such as `http://127.0.0.1:50051`, or several separated by commas
    /// (as `--coordinator` and `BATON_COORDINATOR` take them): see [`Self::coordinators`].
    pub fn coordinator(self, url: impl Into<String>) -> Self {
        self.coordinators([url])
    }

    /// The coordinators' URLs. Each session connects to the next one in turn, after a lost
    /// connection or a coordinator's goodbye, so the worker follows its coordinators through
    /// restarts and failovers. An empty list changes nothing.
    pub fn coordinators(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let addresses: Vec<String> = urls
            .into_iter()
            .flat_map(|url| split_addresses(&url.into()))
            .collect();
        if !addresses.is_empty() {
            self.coordinators = addresses;
        }
        self
    }

    /// How many tasks run at once.
    pub fn concurrency(mut self, tasks: usize) -> Self {
        self.concurrency = tasks.max(1);
        self
    }

    /// The bytes of payload parts kept between tasks, so that results every later step sees
    /// cross the network once; 0 keeps none. Defaults to
    /// [`Worker::DEFAULT_PART_CACHE_BYTES`].
    pub fn part_cache_bytes(mut self, bytes: u64) -> Self {
        self.part_cache_bytes = bytes;
        self
    }

    /// How often the worker tells its coordinator it is alive (and how many slots it has
    /// free). Defaults to [`Worker::DEFAULT_HEARTBEAT_INTERVAL`]; at least a millisecond.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Serves `name` with an async function from task to data (a JSON value, or an
    /// [`Output`] with messages and decisions), or a [`Failure`]. A `String` or `&str` error
    /// (returned with `?` or `.into()`) is a retryable failure.
    pub fn agent<F, Fut, O>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Task) -> Fut + Send + Sync + 'static,
        // The error is `Failure` itself rather than any `E: Into<Failure>`: handlers that only
        // ever return `Ok(...)` would leave `E` to infer and would not compile.
        Fut: Future<Output = Result<O, Failure>> + Send + 'static,
        O: Into<Output> + 'static,
    {
        let handler = Arc::new(handler);
        let handler: Handler = Arc::new(move |task| {
            let answer = handler(task);
            Box::pin(async move { answer.await.map(Into::into) })
        });
        self.agents.insert(name.into(), handler);
        self
    }

    /// How long a shutdown waits for the tasks running to finish and be answered (default
    /// 30 s); what is still running then goes back to the coordinator.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Sees every task and its result.
    pub fn observer(
        mut self,
        observer: impl Fn(&Task, &AgentResult) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Builds a span of every agent execution through the global tracer provider, in its run's
    /// trace. Off by default: then nothing is spent on spans.
    pub fn traces(mut self, on: bool) -> Self {
        self.traces = on;
        self
    }

    pub fn build(self) -> Worker {
        let metrics = crate::metrics::WorkerMetrics::new(self.concurrency);
        Worker {
            id: self.id.unwrap_or_else(default_id),
            coordinators: self.coordinators,
            concurrency: self.concurrency,
            part_cache_bytes: self.part_cache_bytes,
            heartbeat_interval: self.heartbeat_interval,
            agents: self.agents,
            observer: self.observer,
            current: std::sync::Mutex::new(None),
            running: Default::default(),
            draining: Default::default(),
            shutdown_grace: self.shutdown_grace,
            traces: self.traces,
            security: self.security,
            metrics,
        }
    }
}

/// `a,b` as `[a, b]`, without blanks, so that one flag or variable can name several.
fn split_addresses(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(builder: WorkerBuilder) -> Vec<String> {
        builder.build().coordinators
    }

    #[test]
    fn one_coordinator_or_several_separated_by_commas() {
        assert_eq!(
            addresses(Worker::builder().coordinator("http://a:1")),
            ["http://a:1"]
        );
        assert_eq!(
            addresses(Worker::builder().coordinator("http://a:1, http://b:2,")),
            ["http://a:1", "http://b:2"]
        );
        assert_eq!(
            addresses(Worker::builder().coordinators(["http://a:1", "http://b:2,http://c:3"])),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
    }

    #[test]
    fn no_address_keeps_the_ones_set() {
        let builder = Worker::builder().coordinator("http://a:1");
        assert_eq!(addresses(builder.coordinator(" , ")), ["http://a:1"]);
        assert_eq!(
            addresses(Worker::builder().coordinators(Vec::<String>::new())),
            ["http://127.0.0.1:50051"]
        );
    }
}
