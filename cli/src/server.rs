//! `baton coordinator` and `baton worker`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::{Config, Coordinator};
use baton_worker::Worker;
use baton_worker::agents::AgentsFile;

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// Address to serve gRPC on.
    #[arg(long, default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Redis URL, where all run state lives.
    #[arg(long, env = "BATON_REDIS", default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Keep run state in this process's memory instead (lost when it exits; for trials).
    #[arg(long, conflicts_with = "redis")]
    memory: bool,
    #[command(flatten)]
    embeddings: EmbeddingArgs,
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    let embedder = args.embeddings.embedder()?;
    // A test hook: corrupt the first N payloads on the wire, so that an end-to-end test can show
    // workers refuse them and ask again.
    let corrupt_parts: u64 = std::env::var("BATON_TEST_CORRUPT_PARTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    tracing::info!(
        model = embedder.model(),
        "decisions are embedded with this model"
    );
    if args.memory {
        let coordinator =
            Coordinator::with_embedder(MemoryStore::new(), Config::default(), embedder);
        coordinator.hub().corrupt_next_parts(corrupt_parts);
        tracing::info!(%address, store = "memory", "coordinator listening");
        baton_coordinator::grpc::serve(listener, coordinator, shutdown_signal()).await?;
    } else {
        let store = RedisStore::connect(&args.redis)
            .await
            .with_context(|| format!("cannot connect to Redis at {}", args.redis))?;
        let coordinator = Coordinator::with_embedder(store, Config::default(), embedder);
        coordinator.hub().corrupt_next_parts(corrupt_parts);
        let recovered = coordinator.recover().await?;
        tracing::info!(%address, redis = %args.redis, recovered, "coordinator listening");
        baton_coordinator::grpc::serve(listener, coordinator, shutdown_signal()).await?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(
        long,
        env = "BATON_COORDINATOR",
        default_value = "http://127.0.0.1:50051"
    )]
    coordinator: String,
    /// The agents this worker serves (TOML).
    #[arg(long, required_unless_present = "bench_agents")]
    agents: Option<PathBuf>,
    /// Serve the built-in no-op agents `baton bench` uses (`noop`, `blob64k`) instead.
    #[arg(long, hide = true)]
    bench_agents: bool,
    /// The size of the string `blob64k` returns.
    #[arg(long, hide = true, default_value_t = 64 * 1024)]
    bench_blob_bytes: usize,
    /// How many tasks run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
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
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging();
    let mut builder = Worker::builder()
        .coordinator(args.coordinator.clone())
        .concurrency(args.concurrency)
        .part_cache_bytes(args.part_cache_mb << 20)
        .shutdown_grace(std::time::Duration::from_secs(args.grace_seconds));
    if let Some(id) = args.id {
        builder = builder.id(id);
    }
    builder = match &args.agents {
        Some(path) => {
            baton_worker::agents_into(builder, AgentsFile::load(path)?, &args.coordinator)
        }
        None => crate::bench::agents(builder, args.bench_blob_bytes),
    };
    let worker = builder.build();
    tracing::info!(worker_id = worker.id(), "worker starting");
    worker.run(shutdown_signal()).await;
    tracing::info!("worker stopped");
    Ok(ExitCode::SUCCESS)
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
