//! `baton coordinator` and `baton worker`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use baton_coordinator::grpc::Faults;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::redis::{ConnectOptions, RedisStore, WaitReplicas, redacted};
use baton_coordinator::{Config, Coordinator};
use baton_worker::Worker;
use baton_worker::agents::AgentsFile;

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// Address to serve gRPC on.
    #[arg(long, default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Redis URL, where all run state lives: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], or
    /// rediss:// for TLS [default: redis://127.0.0.1:6379]. For a Redis Cluster, the URL of any
    /// node, or several nodes' URLs separated by commas: cluster mode is detected. Give a
    /// password through the environment, which `ps` does not show (BATON_REDIS, the variable's
    /// old name, still works).
    #[arg(long, env = "BATON_REDIS_URL", hide_env_values = true)]
    redis: Option<String>,
    /// After each transition, wait until this many replicas of its Redis master have it
    /// (`WAIT`), so that a failover cannot lose it; a transition that does not get there in
    /// --redis-wait-timeout-ms is not acted on (it is retried or redelivered). 0: do not wait.
    #[arg(long, env = "BATON_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    redis_wait_replicas: u32,
    /// How long a transition (or a read of a run) waits for --redis-wait-replicas replicas
    /// before it is given up on.
    #[arg(long, env = "BATON_REDIS_WAIT_TIMEOUT_MS", default_value_t = 2_000)]
    redis_wait_timeout_ms: u64,
    /// The CA certificate (PEM) that signed the Redis server's certificate, for a rediss:// URL;
    /// without it the system's roots are trusted.
    #[arg(long, env = "BATON_REDIS_CA", value_name = "FILE")]
    redis_ca: Option<PathBuf>,
    /// Keep run state in this process's memory instead (lost when it exits; for trials).
    #[arg(long, conflicts_with = "redis")]
    memory: bool,
    #[command(flatten)]
    embeddings: EmbeddingArgs,
    #[command(flatten)]
    leases: LeaseArgs,
    #[command(flatten)]
    pub(crate) jq: crate::jq_budget::JqArgs,
    #[command(flatten)]
    security: crate::security::ServeArgs,
    /// Where to serve HTTP: the web UI (`/`), Prometheus metrics (`/metrics`), and `/healthz`
    /// and `/readyz` for probes [default: 0.0.0.0:9464; when that is taken, a free port, named
    /// in the log]. Port 0 picks a free one.
    #[arg(long, conflicts_with = "no_metrics")]
    metrics_listen: Option<SocketAddr>,
    /// Serve no metrics, no probes and no web UI.
    #[arg(long)]
    no_metrics: bool,
    /// Where the web UI links a run's trace: an http(s) URL with `{trace_id}` in it, such as
    /// 'https://jaeger.example/trace/{trace_id}'.
    #[arg(long, env = "BATON_TRACE_URL", value_parser = trace_url)]
    trace_url: Option<String>,
}

/// `--trace-url`, checked when the coordinator starts rather than found broken in a link: an
/// http or https URL with a host, and `{trace_id}` where a run's trace id goes.
fn trace_url(text: &str) -> Result<String, String> {
    const EXAMPLE: &str = "such as 'https://jaeger.example/trace/{trace_id}'";
    if !text.contains("{trace_id}") {
        return Err(format!(
            "it has no {{trace_id}}, where the web UI puts a run's trace id ({EXAMPLE})"
        ));
    }
    // The URL a link will be: braces elsewhere in it are the URL's own business.
    let link = text.replace("{trace_id}", "4bf92f3577b34da6a3ce929d0e0e4736");
    let url = reqwest::Url::parse(&link)
        .map_err(|error| format!("it is not a URL ({error}): give an http(s) URL, {EXAMPLE}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "a {}: URL is not a page the web UI can link to: give an http(s) URL, {EXAMPLE}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("it names no host ({EXAMPLE})"));
    }
    Ok(text.to_owned())
}

/// The coordinator's HTTP port unless `--metrics-listen` says otherwise.
const COORDINATOR_HTTP: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9464);
/// The worker's: another port, so that a coordinator and a worker share a machine.
const WORKER_HTTP: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9465);

/// How tasks are leased, and how fast a lost worker or coordinator is noticed.
#[derive(clap::Args)]
pub struct LeaseArgs {
    /// This coordinator's name in task leases, unique among the coordinators of one Redis
    /// (default: host, process id and a random suffix).
    #[arg(long, env = "BATON_COORDINATOR_ID")]
    id: Option<String>,
    /// How long a task's lease lasts without renewal: how long the tasks of a coordinator that
    /// died wait before another coordinator delivers them again.
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// A worker silent (not even a heartbeat) for this long is taken for dead, and its tasks go
    /// to other workers.
    #[arg(long, default_value_t = 5_000)]
    worker_silence_ms: u64,
    /// How often due timers (expired leases, retries) are swept.
    #[arg(long, default_value_t = 200, hide = true)]
    sweep_interval_ms: u64,
    /// A task that waited this long here for a free worker slot goes to another coordinator
    /// whose workers have room (0: tasks stay with the coordinator that dispatched them).
    #[arg(long, default_value_t = 1_000)]
    rebalance_after_ms: u64,
    /// A run this coordinator has not touched for this long (no answer, read, watch or
    /// dispatch) is dropped from its memory, and read back from Redis when it is touched again.
    #[arg(long, default_value_t = 300_000)]
    run_idle_ms: u64,
}

impl LeaseArgs {
    fn config(&self) -> Config {
        let defaults = Config::default();
        Config {
            coordinator_id: self.id.clone().unwrap_or(defaults.coordinator_id.clone()),
            lease_ms: self.lease_ms.max(1),
            worker_silence_ms: self.worker_silence_ms.max(1),
            sweep_interval_ms: self.sweep_interval_ms.max(1),
            rebalance_after_ms: self.rebalance_after_ms,
            run_idle_ms: self.run_idle_ms.max(1),
            ..defaults
        }
    }
}

/// How decisions are embedded for search by meaning.
#[derive(clap::Args)]
pub struct EmbeddingArgs {
    /// An OpenAI-compatible embeddings server (OpenAI, Ollama, vLLM, TEI): a base URL such as
    /// http://localhost:11434, or the full .../v1/embeddings endpoint. Unset: the built-in
    /// offline embedder, which is lexical (it matches shared words, not paraphrases).
    #[arg(long, env = "BATON_EMBEDDINGS_URL")]
    embeddings_url: Option<String>,
    /// The embedding model the server should use.
    #[arg(
        long,
        env = "BATON_EMBEDDINGS_MODEL",
        default_value = "text-embedding-3-small"
    )]
    embeddings_model: String,
    /// Sent as a bearer token (read from the environment, so it stays out of `ps`).
    #[arg(long, env = "BATON_EMBEDDINGS_API_KEY", hide_env_values = true)]
    embeddings_api_key: Option<String>,
}

impl EmbeddingArgs {
    fn embedder(&self) -> anyhow::Result<std::sync::Arc<dyn baton_coordinator::embed::Embedder>> {
        use baton_coordinator::embed::{EmbedderConfig, OpenAiConfig, build};
        let config = match &self.embeddings_url {
            None => EmbedderConfig::Builtin,
            Some(url) => EmbedderConfig::OpenAi(OpenAiConfig {
                api_key: self.embeddings_api_key.clone(),
                ..OpenAiConfig::new(url.clone(), self.embeddings_model.clone())
            }),
        };
        build(&config).context("cannot set up the embeddings server")
    }
}

pub async fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    // The id is chosen once: it names the coordinator in leases and in its spans and metrics.
    let config = args.leases.config();
    let telemetry = crate::telemetry::init("baton-coordinator", Some(&config.coordinator_id))?;
    let config = Config {
        traces: telemetry.enabled(),
        ..config
    };
    let served = serve_coordinator(args, config).await;
    // After the last transition: its spans go out before the process does.
    telemetry.shutdown().await;
    served
}

async fn serve_coordinator(args: CoordinatorArgs, config: Config) -> anyhow::Result<ExitCode> {
    let config = args.jq.install(config)?;
    let security = args.security.security()?;
    tracing::info!(security = %args.security.describe(), "the port is secured");
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| {
            crate::port_in_use::bind_error("listen on", args.listen, "--listen", error)
        })?;
    let address = listener.local_addr()?;
    let embedder = args.embeddings.embedder()?;
    // A test hook: corrupt the first N payloads on the wire, so that an end-to-end test can show
    // workers refuse them and ask again.
    let corrupt_parts: u64 = std::env::var("BATON_TEST_CORRUPT_PARTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let faults = Faults::corrupt_parts(corrupt_parts);
    tracing::info!(
        model = embedder.model(),
        "decisions are embedded with this model"
    );
    if args.memory {
        let coordinator = Coordinator::with_embedder(MemoryStore::new(), config, embedder);
        tracing::info!(%address, store = "memory", id = coordinator.id(), "coordinator listening");
        let metrics = metrics_listener(&args).await?;
        serve(
            listener,
            coordinator,
            metrics,
            security,
            faults,
            args.trace_url,
        )
        .await?;
    } else {
        let (store, redis) = connect_redis(&args).await?;
        let coordinator = Coordinator::with_embedder(store, config, embedder);
        // Nothing to recover by hand: the tasks of a coordinator that died come back when their
        // leases run out, to whichever coordinator sweeps them first.
        tracing::info!(%address, %redis, id = coordinator.id(), "coordinator listening");
        let metrics = metrics_listener(&args).await?;
        serve(
            listener,
            coordinator,
            metrics,
            security,
            faults,
            args.trace_url,
        )
        .await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The Redis of `--redis` (else `BATON_REDIS_URL`, else the older `BATON_REDIS`, else the local
/// default), with `--redis-ca`; the store and its URL as it may be shown, without the password.
async fn connect_redis(args: &CoordinatorArgs) -> anyhow::Result<(RedisStore, String)> {
    let url = match &args.redis {
        Some(url) => url.clone(),
        None => std::env::var("BATON_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    };
    let ca_pem = match &args.redis_ca {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --redis-ca {}", path.display()))?,
        ),
        None => None,
    };
    let wait = (args.redis_wait_replicas > 0).then(|| WaitReplicas {
        replicas: args.redis_wait_replicas,
        timeout: std::time::Duration::from_millis(args.redis_wait_timeout_ms.max(1)),
    });
    let options = ConnectOptions {
        ca_pem,
        wait,
        ..ConnectOptions::default()
    };
    // The store's errors name the URL, redacted, and what to fix.
    let store = RedisStore::connect_with(&url, options).await?;
    Ok((store, redacted(&url)))
}

/// Serves until SIGTERM or Ctrl-C, then drains: workers are told to move to another
/// coordinator (taking their running tasks with them) and queued tasks are released, before the
/// streams close. The coordinator's background work ([`Coordinator::run`]) runs meanwhile, and
/// has stopped when this returns.
async fn serve<S: baton_coordinator::store::Store>(
    listener: tokio::net::TcpListener,
    coordinator: Coordinator<S>,
    metrics: Option<tokio::net::TcpListener>,
    security: baton_coordinator::grpc::Security,
    faults: Faults,
    trace_url: Option<String>,
) -> anyhow::Result<()> {
    let source = coordinator.clone();
    let export = crate::telemetry::metrics::start(
        "baton-coordinator",
        coordinator.id(),
        std::sync::Arc::new(move || source.metric_families()),
    )?;
    // Ends with this function, whichever way it returns: probes see the drain until the end.
    let _http = metrics.map(|listener| {
        let scraped = coordinator.clone();
        let probed = coordinator.clone();
        let ready: crate::http_endpoint::Readiness = std::sync::Arc::new(move || {
            let probed = probed.clone();
            Box::pin(async move { probed.readiness().await.map_err(|e| e.to_string()) })
        });
        let web =
            baton_coordinator::web::router(coordinator.clone(), security.gate.clone(), trace_url);
        let server = tokio::spawn(crate::http_endpoint::serve(
            listener,
            move || scraped.metrics_text(),
            ready,
            web,
        ));
        AbortOnDrop(server.abort_handle())
    });
    let draining = coordinator.clone();
    let shutdown = async move {
        shutdown_signal().await;
        draining.shutdown().await;
        // Time for the goodbyes to leave before the streams are cut.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    // The coordinator's clock and movers of live output run while it serves, and stop once
    // the streams are closed (the drain above has stopped its clock already).
    let (streams_closed, closed) = tokio::sync::oneshot::channel::<()>();
    let running = coordinator.clone();
    let run = running.run(async {
        let _ = closed.await;
    });
    let serve = async {
        let served =
            baton_coordinator::grpc::serve_with(listener, coordinator, shutdown, security, faults)
                .await;
        let _ = streams_closed.send(());
        served
    };
    let ((), served) = tokio::join!(run, serve);
    if let Some(export) = export {
        export.shutdown().await;
    }
    served?;
    Ok(())
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The coordinator's URL, or several separated by commas: after losing one (or being told
    /// it is shutting down) the worker connects to the next.
    #[arg(
        long,
        env = "BATON_COORDINATOR",
        default_value = "http://127.0.0.1:50051"
    )]
    coordinator: String,
    /// The agents this worker serves (TOML).
    #[arg(long, required_unless_present = "bench_agents")]
    agents: Option<PathBuf>,
    /// Serve the built-in no-op agents `baton bench` uses (`noop`, `blob64k`) too.
    #[arg(long, hide = true)]
    bench_agents: bool,
    /// The size of the string `blob64k` returns.
    #[arg(long, hide = true, default_value_t = 64 * 1024)]
    bench_blob_bytes: usize,
    /// How many tasks run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    #[command(flatten)]
    connection: crate::security::ClientArgs,
    /// MiB of payload parts (earlier results) kept between tasks, so that each crosses the
    /// network to this worker once; 0 keeps none.
    #[arg(long, default_value_t = Worker::DEFAULT_PART_CACHE_BYTES >> 20)]
    part_cache_mb: u64,
    /// The worker's id (default: host name and process id).
    #[arg(long)]
    id: Option<String>,
    /// On SIGTERM or Ctrl-C: take no new tasks, and wait this long for the running ones to
    /// finish and be answered before exiting (what is left goes to another worker).
    #[arg(long, default_value_t = 30)]
    grace_seconds: u64,
    /// Where to serve HTTP: Prometheus metrics (`/metrics`), and `/healthz` and `/readyz`
    /// (ready while connected to a coordinator) for probes [default: 0.0.0.0:9465; when that is
    /// taken, a free port, named in the log]. Port 0 picks a free one.
    #[arg(long, conflicts_with = "no_metrics")]
    metrics_listen: Option<SocketAddr>,
    /// Serve no metrics and no probes.
    #[arg(long)]
    no_metrics: bool,
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    let worker = build_worker(&args, crate::telemetry::configured())?;
    let telemetry = crate::telemetry::init("baton-worker", Some(worker.id()))?;
    let served = serve_worker(args, worker).await;
    telemetry.shutdown().await;
    served
}

fn build_worker(args: &WorkerArgs, traces: bool) -> anyhow::Result<Worker> {
    let mut builder = Worker::builder()
        .traces(traces)
        .coordinator(args.coordinator.clone())
        .concurrency(args.concurrency)
        .part_cache_bytes(args.part_cache_mb << 20)
        .shutdown_grace(std::time::Duration::from_secs(args.grace_seconds));
    if let Some(id) = &args.id {
        builder = builder.id(id.clone());
    }
    builder = builder.security(args.connection.security()?);
    if let Some(path) = &args.agents {
        builder = baton_worker::agents_into(builder, AgentsFile::load(path)?);
    }
    if args.bench_agents {
        builder = crate::bench::agents(builder, args.bench_blob_bytes);
    }
    Ok(builder.build())
}

async fn serve_worker(args: WorkerArgs, worker: Worker) -> anyhow::Result<ExitCode> {
    tracing::info!(worker_id = worker.id(), "worker starting");
    let _http = if args.no_metrics {
        None
    } else {
        let listener = crate::http_endpoint::bind(args.metrics_listen, WORKER_HTTP).await?;
        let metrics = worker.metrics();
        let probed = worker.metrics();
        let ready: crate::http_endpoint::Readiness = std::sync::Arc::new(move || {
            let connected = probed.connected();
            Box::pin(async move {
                if connected {
                    Ok(())
                } else {
                    Err("not connected to a coordinator".to_owned())
                }
            })
        });
        let server = tokio::spawn(crate::http_endpoint::serve(
            listener,
            move || metrics.render(),
            ready,
            axum::Router::new(),
        ));
        Some(AbortOnDrop(server.abort_handle()))
    };
    let metrics = worker.metrics();
    let export = crate::telemetry::metrics::start(
        "baton-worker",
        worker.id(),
        std::sync::Arc::new(move || metrics.families()),
    )?;
    let ran = worker.run(shutdown_signal()).await;
    if let Some(export) = export {
        export.shutdown().await;
    }
    ran?;
    tracing::info!("worker stopped");
    Ok(ExitCode::SUCCESS)
}

/// The coordinator's metrics listener, unless `--no-metrics`.
async fn metrics_listener(
    args: &CoordinatorArgs,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    if args.no_metrics {
        return Ok(None);
    }
    let listener = crate::http_endpoint::bind(args.metrics_listen, COORDINATOR_HTTP).await?;
    Ok(Some(listener))
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
