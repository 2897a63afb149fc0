//! The Baton image (`deploy/docker/Dockerfile`), built with the Docker engine on this machine
//! from the `baton` binary cargo built for this run: it is what compose and Kubernetes run, so it
//! must start as a non-root user with no shell to break into, carry its OCI labels, and serve the
//! health endpoints the probes use on its own address. The Dockerfile passes hadolint.
//!
//! No registry can be reached here: `deploy/docker/local-images.sh` makes local stand-ins for the
//! base images (see `support/images.rs`), with `Dockerfile.prebuilt`; the from-source
//! `Dockerfile` shares its runtime stage and needs no BuildKit.

#[path = "support/images.rs"]
mod images;
#[path = "support/recipes.rs"]
mod recipes;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use images::{Cleanup, DOCKER_DEADLINE, STAND_IN_LABEL, docker, images, run, tool};
use serde_json::Value;

/// How long a container gets to come up.
const START: Duration = Duration::from_secs(30);

/// `docker image inspect IMAGE`'s `Config`.
fn config(image: &str) -> Value {
    let text = docker(&["image", "inspect", "--format", "{{json .Config}}", image]);
    serde_json::from_str(&text).expect("docker prints the config as JSON")
}

/// What users and tools read from the image (its version, where its code is, its license) and
/// how it is started are set by the Dockerfile, not left to the base image.
#[test]
fn the_image_carries_its_oci_labels_user_ports_and_entrypoint() {
    let images = images();
    let config = config(images.baton);
    let label = |name: &str| {
        config["Labels"][name]
            .as_str()
            .unwrap_or_else(|| panic!("no label {name} on {}: {config:#}", images.baton))
            .to_owned()
    };
    assert_eq!(label("org.opencontainers.image.title"), "baton");
    assert_eq!(
        label("org.opencontainers.image.version"),
        env!("CARGO_PKG_VERSION")
    );
    assert!(!label("org.opencontainers.image.revision").is_empty());
    assert_eq!(label("org.opencontainers.image.licenses"), "Apache-2.0");
    assert!(!label("org.opencontainers.image.description").is_empty());
    // Built on a stand-in base, the image must not pass for a stand-in itself.
    assert_ne!(label(STAND_IN_LABEL), "true");

    assert_eq!(config["User"], "65532:65532", "{config:#}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["baton"]));
    // glibc malloc's thresholds, as `baton bench` runs its processes (cli/src/bench/cluster.rs).
    for setting in [
        "MALLOC_MMAP_THRESHOLD_=33554432",
        "MALLOC_TRIM_THRESHOLD_=67108864",
    ] {
        assert!(
            config["Env"]
                .as_array()
                .is_some_and(|env| env.iter().any(|e| e == setting)),
            "{setting} is not set: {config:#}"
        );
    }
    for port in ["50051/tcp", "9464/tcp", "9465/tcp"] {
        assert!(
            config["ExposedPorts"].get(port).is_some(),
            "{port} is not exposed: {config:#}"
        );
    }

    let version = docker(&["run", "--rm", images.baton, "--version"]);
    assert_eq!(version, format!("baton {}", env!("CARGO_PKG_VERSION")));
}

/// hadolint checks both Dockerfiles against Docker's best practices (pinned tags, no `latest`,
/// exec-form entrypoints, ...): any finding, even a style one, fails.
#[test]
fn the_dockerfiles_pass_hadolint() {
    let hadolint = tool("hadolint");
    let root = images::root();
    for file in [
        "deploy/docker/Dockerfile",
        "deploy/docker/Dockerfile.prebuilt",
    ] {
        let output = run(
            Command::new(&hadolint)
                .current_dir(&root)
                .args(["--failure-threshold", "style", file]),
            DOCKER_DEADLINE,
        );
        assert!(
            output.status.success(),
            "hadolint found problems in {file}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The image built from source and the one built from a binary are the same image: their
/// runtime stages are the same text, from the base to the labels.
#[test]
fn both_dockerfiles_make_the_same_runtime_stage() {
    let root = images::root();
    let runtime = |file: &str| {
        let text = std::fs::read_to_string(root.join(file)).expect("read a Dockerfile");
        let start = text
            .find("FROM gcr.io/distroless")
            .unwrap_or_else(|| panic!("{file} has no runtime stage"));
        let lines: Vec<String> = text[start..]
            .lines()
            // Where the binary comes from is what differs.
            .filter(|line| !line.starts_with("COPY "))
            .map(str::to_owned)
            .collect();
        lines
    };
    assert_eq!(
        runtime("deploy/docker/Dockerfile"),
        runtime("deploy/docker/Dockerfile.prebuilt")
    );
}

/// The from-source Dockerfile uses nothing only BuildKit understands, so the classic builder
/// builds it too: on a Docker without BuildKit it failed at once (`COPY failed: stat baton`, a
/// stage of the prebuilt variant it had to build on the way).
#[test]
fn the_source_dockerfile_needs_no_buildkit() {
    let text = std::fs::read_to_string(images::root().join("deploy/docker/Dockerfile"))
        .expect("read the Dockerfile");
    for buildkit_only in [
        "--mount",
        "--link",
        "# syntax=",
        "<<",
        "--chmod",
        "--exclude",
    ] {
        assert!(
            !text
                .lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .any(|line| line.contains(buildkit_only)),
            "deploy/docker/Dockerfile uses {buildkit_only}, which the classic builder refuses"
        );
    }
    let stages: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("FROM "))
        .collect();
    assert_eq!(
        stages,
        [
            "FROM rust:1.95-bookworm AS build",
            "FROM gcr.io/distroless/cc-debian12:nonroot AS runtime"
        ],
        "every stage before the last is one the image needs: the classic builder builds them all"
    );
}

/// Nothing in the image can run a command for someone who gets into the container: no shell,
/// no busybox, no package manager. The binary is where the Dockerfile says.
#[test]
fn the_image_has_no_shell() {
    let images = images();
    let cleanup = Cleanup::new("image-files");
    let container = docker(&["create", "--label", cleanup.label(), images.baton]);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let tarball = dir.path().join("rootfs.tar");
    docker(&[
        "export",
        "--output",
        tarball.to_str().expect("a UTF-8 path"),
        &container,
    ]);
    let output = run(
        Command::new(tool("tar"))
            .arg("--list")
            .arg("--file")
            .arg(&tarball),
        DOCKER_DEADLINE,
    );
    assert!(output.status.success(), "tar could not list the export");
    let files: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            line.trim_start_matches("./")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    assert!(
        files.iter().any(|file| file == "usr/local/bin/baton"),
        "no usr/local/bin/baton in the image"
    );
    let forbidden = [
        "sh", "bash", "dash", "ash", "busybox", "apt", "apt-get", "dpkg",
    ];
    let found: Vec<&String> = files
        .iter()
        .filter(|file| {
            let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
            ["bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin"].contains(&dir)
                && forbidden.contains(&name)
        })
        .collect();
    assert!(found.is_empty(), "the image has {found:?}");

    // And Docker agrees: there is nothing to exec.
    let shell = run(
        Command::new("docker").args([
            "run",
            "--rm",
            "--label",
            cleanup.label(),
            "--entrypoint",
            "/bin/sh",
            images.baton,
            "-c",
            "true",
        ]),
        DOCKER_DEADLINE,
    );
    assert!(!shell.status.success(), "the image ran /bin/sh");
}

/// A coordinator started from the image, locked down as compose and Kubernetes run it (read-only
/// root filesystem, every capability dropped, no new privileges), runs as uid 65532 and serves
/// `/healthz` and `/readyz` on the container's own address, where a kubelet probes; `baton
/// probe` inside the container, the compose health check, agrees.
#[test]
fn a_coordinator_in_the_image_runs_as_nonroot_and_serves_its_probes_on_its_address() {
    let images = images();
    let cleanup = Cleanup::new("image-coordinator");
    let container = docker(&[
        "run",
        "--detach",
        "--label",
        cleanup.label(),
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--env",
        "NO_COLOR=1",
        images.baton,
        "coordinator",
        "--memory",
    ]);
    let ip = images::container_ip(&container);
    let address = format!("{ip}:9464");
    for path in ["/healthz", "/readyz"] {
        images::wait_for(
            &format!("GET {path} on the coordinator's address {address}"),
            START,
            || match images::http_get(&address, path) {
                Ok((200, _)) => Ok(()),
                Ok((status, body)) => Err(format!("{status} {body}")),
                Err(error) => Err(format!("{error}\n{}", images::logs(&container))),
            },
        );
    }

    // The processes as the host sees them (docker top needs the pid column): every one is uid
    // 65532.
    let top = docker(&["top", &container, "-eo", "uid,pid,args"]);
    let uids: Vec<&str> = top
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(!uids.is_empty(), "docker top shows no process:\n{top}");
    assert!(
        uids.iter().all(|uid| *uid == "65532"),
        "not every process runs as 65532:\n{top}"
    );

    docker(&[
        "exec",
        &container,
        "baton",
        "probe",
        "http://127.0.0.1:9464/readyz",
    ]);
}

/// A `docker` client that builds with BuildKit, and the environment that makes it: the `docker`
/// on PATH when it has the buildx plugin, else a Docker 20.10 client (whose BuildKit is built in;
/// Debian's docker.io installs one at /usr/bin/docker). A recent client without buildx refuses
/// `DOCKER_BUILDKIT=1` outright, which is why `local-images.sh` uses the classic builder unless
/// told otherwise.
fn buildkit_client() -> PathBuf {
    let buildx = run(
        Command::new("docker").args(["buildx", "version"]),
        DOCKER_DEADLINE,
    );
    if buildx.status.success() {
        return tool("docker");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let candidates = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("docker"))
        .filter(|path| path.is_file());
    for client in candidates {
        let version = run(
            Command::new(&client).args(["version", "--format", "{{.Client.Version}}"]),
            DOCKER_DEADLINE,
        );
        let version = String::from_utf8_lossy(&version.stdout);
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|major| major.trim().parse().ok())
            .unwrap_or(0);
        if (18..23).contains(&major) {
            return client;
        }
    }
    panic!(
        "this test needs a docker client that builds with BuildKit: the buildx plugin, or a \
         Docker 20.10 client (Debian's docker.io)"
    )
}

/// `Dockerfile.prebuilt` builds with BuildKit as well as with the classic builder (which
/// `images()` used), offline, never asking a registry for the Rust image.
#[test]
fn the_prebuilt_dockerfile_builds_with_buildkit_without_the_rust_image() {
    let images = images();
    let client = buildkit_client();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let context = dir.path().join("context");
    std::fs::create_dir(&context).expect("a build context");
    // A stand-in for the binary, not run: the same few bytes every time, so that BuildKit's cache
    // does not keep a 100 MB layer per test run.
    let binary = context.join("baton");
    std::fs::write(&binary, "not run: stands in for the baton binary\n").expect("write it");
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make it executable");
    let id_file = dir.path().join("id");
    let root = images::root();
    let output = run(
        Command::new(&client)
            .env("DOCKER_BUILDKIT", "1")
            .arg("build")
            .args(["--progress", "plain"])
            .arg("--file")
            .arg(root.join("deploy/docker/Dockerfile.prebuilt"))
            .arg("--iidfile")
            .arg(&id_file)
            .arg(&context),
        DOCKER_DEADLINE,
    );
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let id = std::fs::read_to_string(&id_file).unwrap_or_default();
    if !id.is_empty() {
        // Untagged: only this test knows it.
        let _ = run(
            Command::new("docker").args(["image", "rm", id.trim()]),
            DOCKER_DEADLINE,
        );
    }
    assert!(output.status.success(), "the BuildKit build failed:\n{log}");
    assert!(log.contains(images.base), "{log}");
    assert!(
        !log.contains("rust:"),
        "BuildKit looked at the Rust image:\n{log}"
    );
}

/// `local-images.sh` is run by every Docker test binary, maybe at the same time: run again, twice
/// at once, it keeps the stand-ins it made (or the real images) and rebuilds nothing.
#[test]
fn local_images_is_idempotent_and_safe_to_run_at_once() {
    let images = images();
    let id = |image: &str| docker(&["image", "inspect", "--format", "{{.Id}}", image]);
    let before: Vec<String> = [images.base, images.redis, images.baton]
        .into_iter()
        .map(id)
        .collect();

    let runs: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(images::local_images))
        .collect();
    for handle in runs {
        let output = handle.join().expect("the script ran");
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "local-images.sh failed:\n{report}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        for image in [images.base, images.redis] {
            assert!(
                report
                    .lines()
                    .any(|line| line.starts_with(&format!("kept {image}:"))),
                "{image} was not kept:\n{report}"
            );
        }
    }

    let after: Vec<String> = [images.base, images.redis, images.baton]
        .into_iter()
        .map(id)
        .collect();
    assert_eq!(before, after, "an image changed");
}

/// README.md's Docker quickstart, run as printed from the repository root: `docker run` of the
/// examples, mounted, on `baton:dev`. The `docker build` line before it needs the Rust image from
/// a registry, which no registry here serves: `images()` built `baton:dev` from this run's binary
/// with `Dockerfile.prebuilt`, whose runtime stage is the same text
/// (`both_dockerfiles_make_the_same_runtime_stage`).
#[test]
fn the_readme_s_docker_quickstart_runs_the_examples_as_printed() {
    images();
    let lines = recipes::block("README.md", "With Docker and no Rust");
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with("docker build -f deploy/docker/Dockerfile -t baton:dev"),
        "{lines:#?}"
    );
    let output = run(
        Command::new("bash")
            .args(["-c", &lines[1]])
            .current_dir(images::root()),
        DOCKER_DEADLINE,
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "(agent planner) received:",
        "✓ approve-plan",
        "✓ parallel-tests",
    ] {
        assert!(printed.contains(line), "no {line:?} in:\n{printed}");
    }
}
