//! The dev overlay's pods, run the way a kubelet would run them, with the Docker engine on this
//! machine instead of a cluster: what `kubectl kustomize deploy/kubernetes/overlays/dev` renders
//! is what starts, so a wrong argument, a variable that does not resolve, a file mounted where
//! the process does not look, a probe on the wrong port or a grace period too short fails here.
//!
//! For each container of each rendered workload: `docker run` of its image with its exact
//! `command` and `args` (`$(VAR)` expanded as kubelet does), its environment (literal values,
//! Secret and ConfigMap keys taken from the rendered generated objects, the downward API's pod
//! name), its ConfigMap and Secret volumes written to files and mounted read-only at their mount
//! paths, emptyDirs as tmpfs, a volume claim as a Docker volume, `--read-only`, `--cap-drop ALL`,
//! no-new-privileges and the user, group and fsGroup of its securityContext, its memory and CPU
//! limits. All on a private network where each Service's name (and a StatefulSet pod's
//! `POD.SERVICE`) is an alias of the pods it selects: that is how the names in the manifests
//! resolve. Each readiness, liveness and startup probe is asked as kubelet asks it (HTTP GET on
//! the pod's address, 200-399; or a TCP connect).
//!
//! Then the feature-development workflow runs through them from this machine with the dev
//! overlay's `ci` token. A second run's `plan` task is in flight (the test gives the planner a
//! `delay_ms`, the one change it makes to the rendered objects) when its worker gets SIGTERM: the
//! worker must finish and answer it and exit, and a replacement worker pod takes the rest. Each
//! container gets SIGTERM and must exit with status 0 within its `terminationGracePeriodSeconds`
//! (less its preStop sleep, which kubelet would spend first). Redis and a coordinator started
//! again on the same volume still serve both runs as they were, and their state chains verify:
//! nothing was lost.

#[path = "support/images.rs"]
mod images;
#[path = "support/kustomize.rs"]
mod kustomize;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use images::{Cleanup, DOCKER_DEADLINE, container_ip, docker, http_get, logs, run, tool, wait_for};
use kustomize::{labels, name};
use serde_json::Value;

/// The namespace the dev overlay installs into (the downward API's metadata.namespace).
const NAMESPACE: &str = "baton";
/// How long a probe that kubelet would keep retrying (readiness) gets before the test gives up.
const READY: Duration = Duration::from_secs(60);
/// How long a run of the example workflow may take.
const RUN: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The rendered overlay
// ---------------------------------------------------------------------------------------------

/// `kubectl kustomize deploy/kubernetes/overlays/dev`, as JSON objects.
fn render_dev() -> Vec<Value> {
    kustomize::render(&images::root().join("deploy/kubernetes/overlays/dev")).1
}

fn find<'a>(objects: &'a [Value], kind: &str, object_name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|object| object["kind"] == kind && name(object) == object_name)
}

/// The keys of a Secret or ConfigMap, decoded; `None` if the overlay renders no such object.
fn keys_of(objects: &[Value], kind: &str, object_name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let object = find(objects, kind, object_name)?;
    let mut keys = BTreeMap::new();
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let text = value.as_str().unwrap_or_default();
        let bytes = if kind == "Secret" {
            // Long values come wrapped over several lines.
            let text: String = text.split_whitespace().collect();
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &text)
                .unwrap_or_else(|e| panic!("not base64 ({e}): {text:?}"))
        } else {
            text.as_bytes().to_vec()
        };
        keys.insert(key.clone(), bytes);
    }
    for (key, value) in object["stringData"].as_object().into_iter().flatten() {
        keys.insert(
            key.clone(),
            value.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    Some(keys)
}

/// Kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a `$`, anything else
/// stays as written.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some((_, value)) = env.iter().rev().find(|(k, _)| *k == inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// "512Mi" as bytes.
fn memory_bytes(quantity: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().expect("a memory quantity") * factor;
        }
    }
    quantity.parse().expect("a memory quantity")
}

/// "250m" or "2" as CPUs.
fn cpus(quantity: &str) -> f64 {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().expect("a CPU quantity") / 1000.0,
        None => quantity.parse().expect("a CPU quantity"),
    }
}

// ---------------------------------------------------------------------------------------------
// Pods under Docker
// ---------------------------------------------------------------------------------------------

/// A container started for a pod.
struct Started {
    /// The Docker container's name.
    container: String,
    /// The pod's name (its hostname, and what the downward API says).
    pod: String,
    /// The rendered workload it runs a pod of.
    workload: Value,
    ip: String,
}

/// The smoke test's world: the rendered objects, the Docker network, the files mounted into the
/// containers, and what was started. On a failing test, prints every container's log; its
/// `cleanup` removes them all (and the network and volumes) when it is dropped.
struct Kubelet {
    objects: Vec<Value>,
    network: String,
    files: tempfile::TempDir,
    started: Vec<Started>,
    cleanup: Cleanup,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for started in &self.started {
                eprintln!(
                    "---- {} (pod {}) ----\n{}",
                    started.container,
                    started.pod,
                    logs(&started.container)
                );
            }
        }
    }
}

impl Kubelet {
    fn new(objects: Vec<Value>) -> Kubelet {
        let cleanup = Cleanup::new("pod-smoke");
        let network = images::unique_name("pod-smoke");
        docker(&["network", "create", "--label", cleanup.label(), &network]);
        Kubelet {
            objects,
            network,
            files: tempfile::tempdir().expect("a folder for mounted files"),
            started: Vec::new(),
            cleanup,
        }
    }

    fn workload(&self, component: &str) -> Value {
        let found: Vec<&Value> = self
            .objects
            .iter()
            .filter(|object| object["kind"] == "Deployment" || object["kind"] == "StatefulSet")
            .filter(|workload| {
                workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
                    == component
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "the dev overlay should run one {component} workload"
        );
        found[0].clone()
    }

    /// Starts one pod of `workload` as `pod` and waits until its probes pass.
    fn start(&mut self, workload: &Value, pod: &str) -> usize {
        let spec = &workload["spec"]["template"]["spec"];
        assert_eq!(
            spec["enableServiceLinks"],
            false,
            "{}: this test does not make kubelet's service link variables",
            name(workload)
        );
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(
            containers.len(),
            1,
            "{}: one container per pod",
            name(workload)
        );
        assert!(
            spec["initContainers"].is_null(),
            "init containers are not run here"
        );
        let container = &containers[0];
        // A pod started again (Redis's, after its restart) is a new container of the same pod.
        let docker_name = format!("{}-{pod}-{}", self.network, self.started.len());
        let mut command: Vec<String> = vec![
            "run".into(),
            "--detach".into(),
            "--name".into(),
            docker_name.clone(),
            "--label".into(),
            self.cleanup.label().into(),
            "--network".into(),
            self.network.clone(),
            "--hostname".into(),
            pod.into(),
        ];
        for alias in self.aliases(workload, pod) {
            command.extend(["--network-alias".into(), alias]);
        }
        command.extend(self.security(workload, container));
        command.extend(self.resources(container));
        let env = self.environment(container, pod);
        for (key, value) in &env {
            command.extend(["--env".into(), format!("{key}={value}")]);
        }
        command.extend(self.volumes(workload, container, pod));
        let image = container["image"].as_str().expect("image").to_owned();
        let strings = |key: &str| -> Vec<String> {
            container[key]
                .as_array()
                .into_iter()
                .flatten()
                .map(|arg| expand(arg.as_str().expect("a string"), &env))
                .collect()
        };
        let (entrypoint, args) = match strings("command").split_first() {
            // `command` replaces the image's entrypoint (and its CMD), as in Kubernetes.
            Some((first, rest)) => {
                command.extend(["--entrypoint".into(), first.clone()]);
                (rest.to_vec(), strings("args"))
            }
            None => (Vec::new(), strings("args")),
        };
        command.push(image);
        command.extend(entrypoint);
        command.extend(args);
        let output = run(Command::new("docker").args(&command), DOCKER_DEADLINE);
        assert!(
            output.status.success(),
            "docker {} failed:\n{}",
            command.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        let ip = container_ip(&docker_name);
        self.started.push(Started {
            container: docker_name,
            pod: pod.to_owned(),
            workload: workload.clone(),
            ip,
        });
        let index = self.started.len() - 1;
        self.probe_until_ready(index);
        index
    }

    /// The names this pod answers to on the network: every Service selecting it, and for a
    /// StatefulSet's pod its own name under its governing Service.
    fn aliases(&self, workload: &Value, pod: &str) -> Vec<String> {
        let pod_labels = labels(&workload["spec"]["template"]["metadata"]["labels"]);
        let mut aliases = Vec::new();
        for service in self.objects.iter().filter(|o| o["kind"] == "Service") {
            let selector = labels(&service["spec"]["selector"]);
            if !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)) {
                aliases.push(name(service).to_owned());
                aliases.push(format!("{}.{NAMESPACE}.svc", name(service)));
            }
        }
        if let Some(service) = workload["spec"]["serviceName"].as_str() {
            aliases.push(format!("{pod}.{service}"));
        }
        aliases
    }

    fn security(&self, workload: &Value, container: &Value) -> Vec<String> {
        let pod = &workload["spec"]["template"]["spec"]["securityContext"];
        let own = &container["securityContext"];
        let setting = |key: &str| {
            if own[key].is_null() {
                pod[key].clone()
            } else {
                own[key].clone()
            }
        };
        let mut flags = Vec::new();
        let user = setting("runAsUser").as_i64().expect("runAsUser is set");
        assert!(
            user != 0 || setting("runAsNonRoot") != true,
            "runAsNonRoot with user 0"
        );
        let group = setting("runAsGroup").as_i64().unwrap_or(user);
        flags.extend(["--user".into(), format!("{user}:{group}")]);
        if let Some(fs_group) = pod["fsGroup"].as_i64() {
            flags.extend(["--group-add".into(), fs_group.to_string()]);
        }
        if own["readOnlyRootFilesystem"] == true {
            flags.push("--read-only".into());
        }
        if own["allowPrivilegeEscalation"] == false {
            flags.extend(["--security-opt".into(), "no-new-privileges".into()]);
        }
        for capability in own["capabilities"]["drop"].as_array().into_iter().flatten() {
            flags.extend(["--cap-drop".into(), capability.as_str().unwrap().to_owned()]);
        }
        // RuntimeDefault is Docker's default seccomp profile: nothing to add.
        assert_eq!(
            setting("seccompProfile")["type"],
            "RuntimeDefault",
            "{}: only RuntimeDefault is emulated",
            name(workload)
        );
        flags
    }

    fn resources(&self, container: &Value) -> Vec<String> {
        let limits = &container["resources"]["limits"];
        let mut flags = Vec::new();
        if let Some(memory) = limits["memory"].as_str() {
            flags.extend(["--memory".into(), memory_bytes(memory).to_string()]);
        }
        if let Some(cpu) = limits["cpu"].as_str() {
            flags.extend(["--cpus".into(), cpus(cpu).to_string()]);
        }
        flags
    }

    /// The container's environment in kubelet's order: `envFrom`, then `env`, each value
    /// expanded against the variables before it.
    fn environment(&self, container: &Value, pod: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for source in container["envFrom"].as_array().into_iter().flatten() {
            let (kind, reference) = if source["secretRef"].is_object() {
                ("Secret", &source["secretRef"])
            } else {
                ("ConfigMap", &source["configMapRef"])
            };
            let object_name = reference["name"].as_str().unwrap();
            match keys_of(&self.objects, kind, object_name) {
                Some(keys) => {
                    for (key, value) in keys {
                        env.push((key, String::from_utf8(value).expect("UTF-8")));
                    }
                }
                None => assert!(
                    reference["optional"] == true,
                    "{kind} {object_name} is not rendered and not optional"
                ),
            }
        }
        for entry in container["env"].as_array().into_iter().flatten() {
            let key = entry["name"].as_str().unwrap().to_owned();
            let value = if let Some(value) = entry["value"].as_str() {
                expand(value, &env)
            } else if let Some(field) = entry["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "metadata.name" => pod.to_owned(),
                    "metadata.namespace" => NAMESPACE.to_owned(),
                    "spec.nodeName" => "pod-smoke-node".to_owned(),
                    other => panic!("the downward API's {other} is not emulated"),
                }
            } else {
                let (kind, reference) = if entry["valueFrom"]["secretKeyRef"].is_object() {
                    ("Secret", &entry["valueFrom"]["secretKeyRef"])
                } else {
                    ("ConfigMap", &entry["valueFrom"]["configMapKeyRef"])
                };
                let object_name = reference["name"].as_str().unwrap();
                let wanted = reference["key"].as_str().unwrap();
                match keys_of(&self.objects, kind, object_name)
                    .and_then(|keys| keys.get(wanted).cloned())
                {
                    Some(bytes) => String::from_utf8(bytes).expect("UTF-8"),
                    None if reference["optional"] == true => continue,
                    None => panic!("{key}: {kind} {object_name} has no key {wanted}"),
                }
            };
            env.push((key, value));
        }
        env
    }

    /// The container's mounts: ConfigMaps and Secrets written to files (mode and fsGroup as
    /// kubelet sets them) and bound read-only, emptyDirs as tmpfs, volume claims as Docker
    /// volumes.
    fn volumes(&self, workload: &Value, container: &Value, pod: &str) -> Vec<String> {
        let spec = &workload["spec"]["template"]["spec"];
        let fs_group = spec["securityContext"]["fsGroup"].as_i64();
        let mut flags = Vec::new();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let volume_name = mount["name"].as_str().unwrap();
            let path = mount["mountPath"].as_str().unwrap();
            let read_only = if mount["readOnly"] == true { ":ro" } else { "" };
            assert!(
                mount["subPath"].is_null(),
                "subPath mounts are not emulated"
            );
            let claim = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|volume| volume["name"] == volume_name);
            let Some(volume) = claim else {
                // A volumeClaimTemplate: a Docker volume per pod, kept across restarts of the
                // pod like the claim `NAME-POD`.
                let templates = workload["spec"]["volumeClaimTemplates"].as_array();
                assert!(
                    templates
                        .is_some_and(|t| t.iter().any(|c| c["metadata"]["name"] == volume_name)),
                    "{}: volume {volume_name} is defined nowhere",
                    name(workload)
                );
                let docker_volume = format!("{}-{volume_name}-{pod}", self.network);
                docker(&[
                    "volume",
                    "create",
                    "--label",
                    self.cleanup.label(),
                    &docker_volume,
                ]);
                flags.extend([
                    "--volume".into(),
                    format!("{docker_volume}:{path}{read_only}"),
                ]);
                continue;
            };
            if let Some(size) = volume["emptyDir"]["sizeLimit"]
                .as_str()
                .map(memory_bytes)
                .or_else(|| volume["emptyDir"].is_object().then_some(64 << 20))
            {
                flags.extend(["--tmpfs".into(), format!("{path}:rw,mode=1777,size={size}")]);
                continue;
            }
            let (kind, source, object_name) = if volume["secret"].is_object() {
                (
                    "Secret",
                    &volume["secret"],
                    volume["secret"]["secretName"].as_str().unwrap(),
                )
            } else if volume["configMap"].is_object() {
                (
                    "ConfigMap",
                    &volume["configMap"],
                    volume["configMap"]["name"].as_str().unwrap(),
                )
            } else {
                panic!(
                    "{}: volume {volume_name} is of a kind not emulated",
                    name(workload)
                );
            };
            let keys = keys_of(&self.objects, kind, object_name)
                .unwrap_or_else(|| panic!("{kind} {object_name} is not rendered"));
            let dir = self.files.path().join(format!("{pod}-{volume_name}"));
            std::fs::create_dir_all(&dir).unwrap();
            set_mode(&dir, 0o755);
            let mode = source["defaultMode"].as_u64().unwrap_or(0o644) as u32;
            let items: Vec<(String, String)> = match source["items"].as_array() {
                Some(items) => items
                    .iter()
                    .map(|item| {
                        (
                            item["key"].as_str().unwrap().into(),
                            item["path"].as_str().unwrap().into(),
                        )
                    })
                    .collect(),
                None => keys.keys().map(|key| (key.clone(), key.clone())).collect(),
            };
            for (key, file) in items {
                let target = dir.join(&file);
                std::fs::write(&target, &keys[&key]).unwrap();
                set_mode(&target, mode);
                give_group(&target, fs_group, mode);
            }
            flags.extend([
                "--volume".into(),
                format!("{}:{path}{read_only}", dir.display()),
            ]);
        }
        flags
    }

    /// Asks each probe as kubelet would: the startup probe until it passes (within its
    /// failureThreshold x periodSeconds), then readiness until it passes and liveness once.
    fn probe_until_ready(&self, index: usize) {
        let started = &self.started[index];
        let container = &started.workload["spec"]["template"]["spec"]["containers"][0];
        let what = |probe: &str| format!("{} ({}): {probe}", started.pod, started.container);
        let budget = |probe: &Value| {
            let seconds = probe["initialDelaySeconds"].as_u64().unwrap_or(0)
                + probe["periodSeconds"].as_u64().unwrap_or(10)
                    * probe["failureThreshold"].as_u64().unwrap_or(3);
            Duration::from_secs(seconds)
        };
        let startup = &container["startupProbe"];
        if startup.is_object() {
            wait_for(&what("startupProbe"), budget(startup), || {
                self.ask(index, startup)
            });
        }
        let readiness = &container["readinessProbe"];
        assert!(readiness.is_object(), "{}", what("no readinessProbe"));
        wait_for(&what("readinessProbe"), READY, || {
            self.ask(index, readiness)
        });
        let liveness = &container["livenessProbe"];
        assert!(liveness.is_object(), "{}", what("no livenessProbe"));
        wait_for(&what("livenessProbe"), budget(liveness), || {
            self.ask(index, liveness)
        });
    }

    /// One probe: HTTP GET on the pod's address (200-399 passes), or a TCP connect.
    fn ask(&self, index: usize, probe: &Value) -> Result<(), String> {
        let started = &self.started[index];
        let container = &started.workload["spec"]["template"]["spec"]["containers"][0];
        let running = docker(&[
            "inspect",
            "--format",
            "{{.State.Running}}",
            &started.container,
        ]);
        if running != "true" {
            panic!(
                "{} exited:\n{}",
                started.container,
                logs(&started.container)
            );
        }
        let handler = ["httpGet", "tcpSocket"]
            .into_iter()
            .find(|kind| probe[*kind].is_object())
            .unwrap_or_else(|| panic!("a probe kind this test does not emulate: {probe}"));
        let port = &probe[handler]["port"];
        let port = port.as_i64().unwrap_or_else(|| {
            let port_name = port.as_str().unwrap();
            container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == port_name)
                .and_then(|p| p["containerPort"].as_i64())
                .unwrap_or_else(|| panic!("no port named {port_name}"))
        });
        let address = format!("{}:{port}", started.ip);
        if handler == "tcpSocket" {
            let socket = address.parse().unwrap();
            return std::net::TcpStream::connect_timeout(&socket, Duration::from_secs(1))
                .map(|_| ())
                .map_err(|e| format!("{address}: {e}"));
        }
        let path = probe["httpGet"]["path"].as_str().unwrap_or("/");
        let (status, body) = http_get(&address, path)?;
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("GET {address}{path}: {status} {body}"))
        }
    }

    /// SIGTERM, as kubelet sends it after the preStop hook; the container must exit with status
    /// 0 within what is left of its grace period.
    fn terminate(&self, index: usize) {
        let started = &self.started[index];
        let spec = &started.workload["spec"]["template"]["spec"];
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        let pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            spec["containers"][0]["lifecycle"]["preStop"]["exec"].is_null()
                && spec["containers"][0]["lifecycle"]["preStop"]["httpGet"].is_null(),
            "only a preStop sleep is emulated"
        );
        let left = Duration::from_secs(grace - pre_stop);
        let sent = Instant::now();
        docker(&["kill", "--signal", "TERM", &started.container]);
        let code = wait_for(
            &format!(
                "{} exits within its grace period ({grace} s, less {pre_stop} s of preStop)",
                started.pod
            ),
            left,
            || {
                let state = docker(&[
                    "inspect",
                    "--format",
                    "{{.State.Running}} {{.State.ExitCode}}",
                    &started.container,
                ]);
                match state.split_once(' ') {
                    Some(("false", code)) => Ok(code.to_owned()),
                    _ => Err(format!("still running: {state}")),
                }
            },
        );
        eprintln!(
            "{} exited with status {code} {:?} after SIGTERM (it had {left:?})",
            started.pod,
            sent.elapsed()
        );
        assert_eq!(
            code,
            "0",
            "{} exited with status {code} after SIGTERM ({:?}):\n{}",
            started.pod,
            sent.elapsed(),
            logs(&started.container)
        );
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Kubelet makes a volume's files belong to the pod's fsGroup; where this test may not change a
/// file's group (not root), the file is made readable by all instead.
fn give_group(path: &Path, fs_group: Option<i64>, mode: u32) {
    let Some(group) = fs_group else { return };
    if std::os::unix::fs::chown(path, None, Some(group as u32)).is_err() {
        set_mode(path, mode | 0o004);
    }
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// `baton ARGS` from this machine against the coordinator's address, as the dev overlay's `ci`
/// principal.
fn baton(coordinator_ip: &str, args: &[&str]) -> Output {
    let token = std::fs::read_to_string(
        images::root().join("deploy/kubernetes/overlays/dev/secrets/ci-token"),
    )
    .expect("the dev ci token");
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    for variable in [
        "BATON_TLS_CA",
        "BATON_TLS_CERT",
        "BATON_TLS_KEY",
        "BATON_TLS_CLIENT_CERT",
        "BATON_TLS_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "TRACEPARENT",
    ] {
        command.env_remove(variable);
    }
    command
        .env(
            "BATON_COORDINATOR",
            format!("http://{coordinator_ip}:50051"),
        )
        .env("BATON_TOKEN", token)
        .env("NO_COLOR", "1")
        .args(args);
    run(&mut command, DOCKER_DEADLINE)
}

fn baton_ok(coordinator_ip: &str, args: &[&str]) -> String {
    let output = baton(coordinator_ip, args);
    assert!(
        output.status.success(),
        "baton {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn record(coordinator_ip: &str, run_id: &str) -> Result<Value, String> {
    let output = baton(coordinator_ip, &["runs", "get", run_id, "--json"]);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

/// The rendered agents ConfigMap of the worker pool, with `delay_ms` added to the planner: a
/// `plan` task then stays in flight long enough for the test to stop its worker mid-task. The
/// only change the test makes to what the overlay renders.
fn slow_planner(objects: &mut [Value], worker: &Value) {
    let config_map = worker["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|volume| volume["configMap"]["name"].as_str())
        .expect("the pool's agents come from a ConfigMap")
        .to_owned();
    let object = objects
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap" && name(o) == config_map)
        .expect("the agents ConfigMap is rendered");
    let agents = object["data"]["agents.toml"].as_str().expect("agents.toml");
    assert!(
        agents.contains("[agents.planner]\n"),
        "the pool serves no planner"
    );
    let slowed = agents.replace(
        "[agents.planner]\n",
        &format!("[agents.planner]\ndelay_ms = {}\n", PLAN_DELAY.as_millis()),
    );
    object["data"]["agents.toml"] = Value::String(slowed);
}

/// How long the planner takes (see [`slow_planner`]): well within the worker's --grace-seconds.
const PLAN_DELAY: Duration = Duration::from_secs(5);

fn step<'a>(record: &'a Value, id: &str) -> Option<&'a Value> {
    record["steps"]
        .as_array()?
        .iter()
        .find(|step| step["id"] == id)
}

/// Submits the example workflow; its run id.
fn submit(coordinator_ip: &str) -> String {
    let workflow = images::root().join("examples/feature-development/workflow.json");
    baton_ok(
        coordinator_ip,
        &[
            "submit",
            workflow.to_str().unwrap(),
            "--input",
            "Add dark mode toggle",
        ],
    )
}

fn wait_for_approval(coordinator_ip: &str, run_id: &str) {
    wait_for(&format!("run {run_id} waits for approve-plan"), RUN, || {
        let record = record(coordinator_ip, run_id)?;
        let waiting = record["waiting"].as_array().cloned().unwrap_or_default();
        waiting
            .iter()
            .any(|w| w["kind"] == "approval" && w["step_id"] == "approve-plan")
            .then_some(())
            .ok_or_else(|| format!("{record}"))
    });
}

fn wait_for_success(coordinator_ip: &str, run_id: &str) -> Value {
    wait_for(&format!("run {run_id} succeeds"), RUN, || {
        let record = record(coordinator_ip, run_id)?;
        match record["status"].as_str() {
            Some("succeeded") => Ok(record),
            Some("running") => Err(format!("still running: {record}")),
            _ => panic!("run {run_id} did not succeed: {record:#}"),
        }
    })
}

#[test]
fn the_dev_overlay_starts_passes_its_probes_runs_a_workflow_and_drains_under_docker() {
    tool("docker");
    let mut objects = render_dev();
    let built = images::images();
    for object in objects
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
    {
        let image = object["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap();
        assert!(
            [built.baton, built.redis].contains(&image),
            "{} runs {image}, which this test does not build",
            name(object)
        );
    }
    let worker = objects
        .iter()
        .find(|o| {
            o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
        })
        .expect("a worker pool")
        .clone();
    slow_planner(&mut objects, &worker);
    let mut kubelet = Kubelet::new(objects);
    let redis = kubelet.workload("store");
    let coordinator = kubelet.workload("coordinator");
    let worker = kubelet.workload("worker");
    let redis_pod = format!("{}-0", name(&redis));
    let first_worker_pod = format!("{}-5f6b7c8d9-smk01", name(&worker));
    let redis_index = kubelet.start(&redis, &redis_pod);
    let coordinator_index = kubelet.start(
        &coordinator,
        &format!("{}-7c9d8f6b5-smk01", name(&coordinator)),
    );
    let worker_index = kubelet.start(&worker, &first_worker_pod);
    let coordinator_ip = kubelet.started[coordinator_index].ip.clone();

    // The workflow, from this machine, through the coordinator's principals.
    let first = submit(&coordinator_ip);
    wait_for_approval(&coordinator_ip, &first);
    baton_ok(&coordinator_ip, &["approve", &first, "approve-plan"]);
    wait_for_success(&coordinator_ip, &first);

    // A scale-down or a rollout stops the worker while it runs a task: SIGTERM, and the
    // worker must finish and answer it, then exit 0, within its grace period.
    let second = submit(&coordinator_ip);
    wait_for(
        "the second run's plan is running on the worker",
        RUN,
        || {
            let record = record(&coordinator_ip, &second)?;
            match step(&record, "plan").and_then(|plan| plan["status"].as_str()) {
                Some("running") => Ok(()),
                Some("succeeded") => panic!("the plan finished before the worker was stopped"),
                other => Err(format!("plan is {other:?}")),
            }
        },
    );
    kubelet.terminate(worker_index);
    wait_for_approval(&coordinator_ip, &second);
    let drained = record(&coordinator_ip, &second).expect("the second run");
    let plan = step(&drained, "plan").expect("a plan step");
    assert!(
        plan["status"] == "succeeded"
            && plan["attempts"] == 1
            && plan["worker_id"] == first_worker_pod.as_str(),
        "the stopped worker did not finish its task before exiting: {plan:#}"
    );

    // The Deployment's replacement pod takes the rest of the run.
    let second_worker_pod = format!("{}-5f6b7c8d9-smk02", name(&worker));
    let new_worker_index = kubelet.start(&worker, &second_worker_pod);
    baton_ok(&coordinator_ip, &["approve", &second, "approve-plan"]);
    wait_for_success(&coordinator_ip, &second);

    // Kubelet stops the rest: SIGTERM, then SIGKILL after the grace period. Redis last.
    kubelet.terminate(new_worker_index);
    let before: Vec<Value> = [&first, &second]
        .iter()
        .map(|run_id| record(&coordinator_ip, run_id).expect("the run"))
        .collect();
    kubelet.terminate(coordinator_index);
    kubelet.terminate(redis_index);

    // The StatefulSet's pod comes back with its claim, and a new coordinator pod with it: the
    // runs are there, as they were, and their state chains verify.
    let redis_again = kubelet.start(&redis, &redis_pod);
    let coordinator_again = kubelet.start(
        &coordinator,
        &format!("{}-7c9d8f6b5-smk02", name(&coordinator)),
    );
    let coordinator_ip = kubelet.started[coordinator_again].ip.clone();
    for (run_id, before) in [&first, &second].iter().zip(&before) {
        let after = wait_for("the run is read back after the restart", RUN, || {
            record(&coordinator_ip, run_id)
        });
        for field in ["status", "steps", "state_sha256"] {
            assert_eq!(
                after[field], before[field],
                "run {run_id}'s {field} changed across the restart of Redis"
            );
        }
        baton_ok(&coordinator_ip, &["runs", "verify", run_id]);
    }
    kubelet.terminate(coordinator_again);
    kubelet.terminate(redis_again);

    let cleanup_label = kubelet.cleanup.label().to_owned();
    drop(kubelet);
    let left = Cleanup::by_label(&cleanup_label).leftovers();
    assert!(left.is_empty(), "left behind: {left:?}");
}
