//! The Kubernetes manifests (`deploy/kubernetes/`), as kubectl would apply them: every overlay
//! renders with `kubectl kustomize` (kustomize as kubectl bundles it), validates offline
//! against the Kubernetes 1.32 schemas with `kubernetes-validate --strict`, and the objects it
//! has no schema for (KEDA's ScaledObject, the Prometheus Operator's PodMonitor, cert-manager's
//! Certificate and Issuer) are checked here for the fields their CRDs require and for what they
//! point at. Then the properties deploy/README.md promises are asserted on the rendered
//! objects, not on the files: kustomize's patches and components decide what runs.
//!
//! Rendered and checked: `overlays/dev`, `overlays/production`, `prometheus-adapter`, and the
//! production overlay as deploy/README.md tells how to change it (components/keda swapped for
//! components/hpa-prometheus-adapter, components/external-redis added).
//!
//! Needs `kubectl` and `kubernetes-validate` (its Python venv's PyYAML turns the YAML into
//! JSON), on PATH or in `target/test-tools/venv/bin` where `scripts/test` installs the latter.
//! Either missing fails the tests, saying so.

#[path = "support/images.rs"]
mod images;
#[path = "support/kustomize.rs"]
mod kustomize;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use images::{root, tool};
use kustomize::{kind, labels, name, with_input};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The Kubernetes version the manifests are validated against (and documented for).
const KUBERNETES_VERSION: &str = "1.32.0";
/// Kinds `kubernetes-validate` has no schema for, checked by [`check_custom_resources`].
const CUSTOM_KINDS: [&str; 4] = ["ScaledObject", "PodMonitor", "Certificate", "Issuer"];
/// What the base image runs as: distroless's `nonroot`.
const BATON_UID: i64 = 65532;
/// The official Redis image's `redis` user.
const REDIS_UID: i64 = 999;
/// The contract: a coordinator drains on SIGTERM in well under this.
const COORDINATOR_DRAIN_SECONDS: i64 = 5;

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn manifests() -> PathBuf {
    root().join("deploy/kubernetes")
}

/// One kustomization, rendered.
struct Rendered {
    name: String,
    yaml: String,
    objects: Vec<Value>,
}

fn render(name: &str, dir: &Path) -> Rendered {
    let (yaml, objects) = kustomize::render(dir);
    Rendered {
        name: name.to_owned(),
        yaml,
        objects,
    }
}

/// The production overlay changed as deploy/README.md says: HPA instead of KEDA, and a Redis
/// elsewhere. A copy of the overlay in a folder under `target/`, its paths made to point back.
fn render_production_variant() -> Rendered {
    let target = root().join("target");
    std::fs::create_dir_all(&target).expect("create target/");
    let scratch = tempfile::Builder::new()
        .prefix("kubernetes-test-")
        .tempdir_in(&target)
        .expect("a folder under target/");
    let copy = scratch.path().join("production");
    std::fs::create_dir(&copy).unwrap();
    let overlay = manifests().join("overlays/production");
    for entry in std::fs::read_dir(&overlay).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let kustomization = std::fs::read_to_string(copy.join("kustomization.yaml")).unwrap();
    assert!(
        kustomization.contains("  - ../../components/keda\n"),
        "overlays/production no longer lists components/keda as the test expects"
    );
    let changed = kustomization
        .replace(
            "  - ../../components/keda\n",
            "  - ../../components/hpa-prometheus-adapter\n  - ../../components/external-redis\n",
        )
        .replace("../../", "../../../deploy/kubernetes/");
    std::fs::write(copy.join("kustomization.yaml"), changed).unwrap();
    render(
        "production with hpa-prometheus-adapter and external-redis",
        &copy,
    )
}

/// Every rendering, made once for all the tests of this file.
fn renders() -> &'static [Rendered] {
    static RENDERS: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERS.get_or_init(|| {
        let base = manifests();
        vec![
            render("overlays/dev", &base.join("overlays/dev")),
            render("overlays/production", &base.join("overlays/production")),
            render_production_variant(),
            render("prometheus-adapter", &base.join("prometheus-adapter")),
        ]
    })
}

fn overlay(name: &str) -> &'static Rendered {
    renders()
        .iter()
        .find(|rendered| rendered.name == name)
        .expect("rendered")
}

/// The renderings that run Baton (all but the adapter's rules).
fn installations() -> impl Iterator<Item = &'static Rendered> {
    renders()
        .iter()
        .filter(|rendered| rendered.name != "prometheus-adapter")
}

// ---------------------------------------------------------------------------------------------
// Reading rendered objects
// ---------------------------------------------------------------------------------------------

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Whether a label selector (`matchLabels` and `matchExpressions` of In / NotIn / Exists)
/// selects these labels. An absent or empty selector selects everything.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|expression| {
            let value = labels.get(expression["key"].as_str().unwrap_or_default());
            let values: Vec<&str> = expression["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match expression["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v.as_str())),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v.as_str())),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                _ => false,
            }
        });
    by_labels && by_expressions
}

impl Rendered {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|object| object["kind"] == kind)
            .collect()
    }

    fn get(&self, kind: &str, object_name: &str) -> Option<&Value> {
        self.of_kind(kind)
            .into_iter()
            .find(|object| name(object) == object_name)
    }

    /// Deployments and StatefulSets.
    fn workloads(&self) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|object| object["kind"] == "Deployment" || object["kind"] == "StatefulSet")
            .collect()
    }

    /// [`Rendered::by_component`], failing when there is none (a loop over nothing checks
    /// nothing).
    #[track_caller]
    fn expect_component(&self, component: &str) -> Vec<&Value> {
        let found = self.by_component(component);
        assert!(
            !found.is_empty(),
            "{} renders no workload labelled {COMPONENT}={component}",
            self.name
        );
        found
    }

    fn by_component(&self, component: &str) -> Vec<&Value> {
        self.workloads()
            .into_iter()
            .filter(|workload| {
                pod_labels(workload).get(COMPONENT).map(String::as_str) == Some(component)
            })
            .collect()
    }
}

const COMPONENT: &str = "app.kubernetes.io/component";

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn pod_labels(workload: &Value) -> BTreeMap<String, String> {
    labels(&workload["spec"]["template"]["metadata"]["labels"])
}

fn containers(workload: &Value) -> Vec<&Value> {
    let spec = pod_spec(workload);
    ["initContainers", "containers"]
        .iter()
        .flat_map(|key| spec[*key].as_array().into_iter().flatten())
        .collect()
}

fn the_container(workload: &Value) -> &Value {
    let all = &pod_spec(workload)["containers"];
    assert_eq!(
        all.as_array().map(Vec::len),
        Some(1),
        "{} should run one container",
        name(workload)
    );
    &all[0]
}

fn args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The value of `--flag VALUE` or `--flag=VALUE` in a container's args.
fn flag<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    let args = args(container);
    let prefixed = format!("{name}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        if *arg == name {
            args.get(i + 1).copied()
        } else {
            arg.strip_prefix(prefixed.as_str())
        }
    })
}

fn env<'a>(container: &'a Value, variable: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["name"] == variable)
}

fn is_baton(container: &Value) -> bool {
    let image = container["image"].as_str().unwrap_or_default();
    let repository = image.split(':').next().unwrap_or_default();
    repository == "baton" || repository.ends_with("/baton")
}

/// The number of a container's port named `port_name`.
fn port_number(container: &Value, port_name: &str) -> Option<i64> {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|port| port["name"] == port_name)
        .and_then(|port| port["containerPort"].as_i64())
}

/// A probe's port as a number, whether it is given by name or by number.
fn probe_port(container: &Value, port: &Value) -> Option<i64> {
    port.as_i64().or_else(|| {
        port.as_str()
            .and_then(|named| port_number(container, named))
    })
}

fn pre_stop_sleep(container: &Value) -> i64 {
    container
        .pointer("/lifecycle/preStop/sleep/seconds")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// The volume mounted at the folder holding `path`, and the file's name in it.
fn volume_of<'a>(
    workload: &'a Value,
    container: &Value,
    path: &'a str,
) -> Option<(&'a Value, &'a str)> {
    let (folder, file) = path.rsplit_once('/')?;
    let mount = container["volumeMounts"].as_array()?.iter().find(|mount| {
        mount["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(folder)
    })?;
    let volume = pod_spec(workload)["volumes"]
        .as_array()?
        .iter()
        .find(|volume| volume["name"] == mount["name"])?;
    Some((volume, file))
}

/// The agents a worker pool serves: the `[agents.NAME]` tables of its agents file, read from
/// the ConfigMap mounted where `--agents` points.
fn pool_agents(rendered: &Rendered, worker: &Value) -> BTreeSet<String> {
    let container = the_container(worker);
    let path = flag(container, "--agents")
        .unwrap_or_else(|| panic!("{}: worker {} has no --agents", rendered.name, name(worker)));
    let (volume, file) = volume_of(worker, container, path).unwrap_or_else(|| {
        panic!(
            "{}: {} mounts nothing at {path}",
            rendered.name,
            name(worker)
        )
    });
    let config_map = str_at(volume, "/configMap/name").unwrap_or_else(|| {
        panic!(
            "{}: {}'s agents file is not from a ConfigMap",
            rendered.name,
            name(worker)
        )
    });
    let text = rendered
        .get("ConfigMap", config_map)
        .and_then(|map| map["data"][file].as_str())
        .unwrap_or_else(|| panic!("{}: ConfigMap {config_map} has no {file}", rendered.name));
    text.lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("[agents.")?
                .strip_suffix(']')
                .map(|agent| agent.trim_matches('"').to_owned())
        })
        .collect()
}

/// The agents a PromQL query selects with `agent=~"a|b"` or `agent="a"`.
fn query_agents(query: &str) -> BTreeSet<String> {
    let (regex, start) = match query.find("agent=~\"") {
        Some(at) => (true, at + "agent=~\"".len()),
        None => match query.find("agent=\"") {
            Some(at) => (false, at + "agent=\"".len()),
            None => return BTreeSet::new(),
        },
    };
    let value = &query[start..start + query[start..].find('"').unwrap_or(0)];
    if regex {
        value.split('|').map(str::to_owned).collect()
    } else {
        BTreeSet::from([value.to_owned()])
    }
}

/// Fails with every problem found, one per line.
fn assert_none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---------------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------------

/// The fields the CRDs of KEDA, the Prometheus Operator and cert-manager require, and what
/// their objects refer to, which an API server with those CRDs would only find at run time.
fn check_custom_resources(rendered: &Rendered) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |object: &Value, what: String| {
        problems.push(format!("{} {}: {what}", kind(object), name(object)));
    };
    for object in rendered.of_kind("ScaledObject") {
        if object["apiVersion"] != "keda.sh/v1alpha1" {
            problem(object, "apiVersion is not keda.sh/v1alpha1".into());
        }
        let spec = &object["spec"];
        let known = [
            "scaleTargetRef",
            "pollingInterval",
            "cooldownPeriod",
            "initialCooldownPeriod",
            "idleReplicaCount",
            "minReplicaCount",
            "maxReplicaCount",
            "advanced",
            "triggers",
            "fallback",
        ];
        for key in spec.as_object().into_iter().flatten().map(|(key, _)| key) {
            if !known.contains(&key.as_str()) {
                problem(object, format!("spec.{key} is not a ScaledObject field"));
            }
        }
        match str_at(spec, "/scaleTargetRef/name") {
            None => problem(object, "spec.scaleTargetRef.name is required".into()),
            Some(target) if rendered.get("Deployment", target).is_none() => problem(
                object,
                format!("scales Deployment {target}, which is not rendered"),
            ),
            Some(_) => {}
        }
        let min = spec["minReplicaCount"].as_i64().unwrap_or(0);
        let max = spec["maxReplicaCount"].as_i64().unwrap_or(100);
        if min > max {
            problem(
                object,
                format!("minReplicaCount {min} > maxReplicaCount {max}"),
            );
        }
        let triggers = spec["triggers"].as_array().cloned().unwrap_or_default();
        if triggers.is_empty() {
            problem(
                object,
                "spec.triggers is required and may not be empty".into(),
            );
        }
        for trigger in &triggers {
            if !trigger["type"].is_string() || !trigger["metadata"].is_object() {
                problem(
                    object,
                    "every trigger needs a type and a metadata map".into(),
                );
            }
            if let Some(metric_type) = trigger["metricType"].as_str()
                && !["AverageValue", "Value", "Utilization"].contains(&metric_type)
            {
                problem(
                    object,
                    format!("metricType {metric_type} is not one KEDA knows"),
                );
            }
            for (key, value) in trigger["metadata"].as_object().into_iter().flatten() {
                if !value.is_string() {
                    problem(object, format!("trigger metadata {key} must be a string"));
                }
            }
            if trigger["type"] == "prometheus" {
                for key in ["serverAddress", "query", "threshold"] {
                    if !trigger["metadata"][key].is_string() {
                        problem(object, format!("a prometheus trigger needs metadata.{key}"));
                    }
                }
            }
        }
    }
    for object in rendered.of_kind("PodMonitor") {
        if object["apiVersion"] != "monitoring.coreos.com/v1" {
            problem(object, "apiVersion is not monitoring.coreos.com/v1".into());
        }
        let spec = &object["spec"];
        if !spec["selector"].is_object() {
            problem(object, "spec.selector is required".into());
            continue;
        }
        let selected: Vec<&Value> = rendered
            .workloads()
            .into_iter()
            .filter(|workload| selects(&spec["selector"], &pod_labels(workload)))
            .collect();
        if selected.is_empty() {
            problem(object, "selects no pod".into());
        }
        let endpoints = spec["podMetricsEndpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if endpoints.is_empty() {
            problem(
                object,
                "spec.podMetricsEndpoints is empty: nothing is scraped".into(),
            );
        }
        for endpoint in &endpoints {
            let Some(port) = endpoint["port"].as_str() else {
                problem(object, "an endpoint names no port".into());
                continue;
            };
            for workload in &selected {
                if port_number(the_container(workload), port).is_none() {
                    problem(
                        object,
                        format!("{} has no port named {port}", name(workload)),
                    );
                }
            }
        }
    }
    let issuers: BTreeSet<&str> = rendered.of_kind("Issuer").into_iter().map(name).collect();
    let certificate_secrets: BTreeSet<&str> = rendered
        .of_kind("Certificate")
        .into_iter()
        .filter_map(|certificate| str_at(certificate, "/spec/secretName"))
        .collect();
    for object in rendered.of_kind("Certificate") {
        if object["apiVersion"] != "cert-manager.io/v1" {
            problem(object, "apiVersion is not cert-manager.io/v1".into());
        }
        let spec = &object["spec"];
        if !spec["secretName"].is_string() {
            problem(object, "spec.secretName is required".into());
        }
        match (
            str_at(spec, "/issuerRef/name"),
            str_at(spec, "/issuerRef/kind"),
        ) {
            (None, _) => problem(object, "spec.issuerRef.name is required".into()),
            (Some(issuer), Some("Issuer") | None) if !issuers.contains(issuer) => {
                problem(object, format!("its Issuer {issuer} is not rendered"))
            }
            _ => {}
        }
        let named = [
            "commonName",
            "dnsNames",
            "uris",
            "emailAddresses",
            "ipAddresses",
        ]
        .iter()
        .any(|key| !spec[*key].is_null());
        if !named {
            problem(object, "names no subject (commonName, dnsNames...)".into());
        }
    }
    for object in rendered.of_kind("Issuer") {
        if object["apiVersion"] != "cert-manager.io/v1" {
            problem(object, "apiVersion is not cert-manager.io/v1".into());
        }
        let kinds: Vec<&String> = object["spec"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, _)| key)
            .filter(|key| ["selfSigned", "ca", "acme", "vault", "venafi"].contains(&key.as_str()))
            .collect();
        if kinds.len() != 1 {
            problem(
                object,
                format!("must be exactly one kind of issuer, is {kinds:?}"),
            );
        }
        if let Some(secret) = str_at(object, "/spec/ca/secretName")
            && !certificate_secrets.contains(secret)
        {
            problem(
                object,
                format!("its CA secret {secret} is made by no Certificate"),
            );
        }
    }
    problems
}

#[test]
fn every_overlay_renders_and_validates_against_the_kubernetes_schemas() {
    let validate = tool("kubernetes-validate");
    let mut problems = Vec::new();
    for rendered in renders() {
        let output = with_input(
            Command::new(&validate).args(["--strict", "--quiet", "-k", KUBERNETES_VERSION, "-"]),
            rendered.yaml.as_bytes(),
        );
        let printed = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            problems.push(format!(
                "{}: kubernetes-validate failed:\n{printed}",
                rendered.name
            ));
        }
        for line in printed.lines().filter(|line| line.starts_with("WARN")) {
            // An object no schema covers must be one of the CRDs checked below; anything else
            // (a typo in an apiVersion) would otherwise go unchecked.
            let known = CUSTOM_KINDS
                .iter()
                .any(|kind| line.contains(&format!("for kind {kind} with")));
            if !known {
                problems.push(format!("{}: {line}", rendered.name));
            }
        }
        for problem in check_custom_resources(rendered) {
            problems.push(format!("{}: {problem}", rendered.name));
        }
        for object in &rendered.objects {
            if object["metadata"]["namespace"].is_null() && object["kind"] != "Namespace" {
                problems.push(format!(
                    "{}: {} {} has no namespace",
                    rendered.name,
                    kind(object),
                    name(object)
                ));
            }
        }
    }
    assert_none("the manifests do not validate", problems);
}

// ---------------------------------------------------------------------------------------------
// Security
// ---------------------------------------------------------------------------------------------

#[test]
fn every_container_runs_as_non_root_on_a_read_only_root_with_no_capabilities() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for workload in rendered.workloads() {
            let pod = pod_spec(workload);
            let pod_context = &pod["securityContext"];
            for container in containers(workload) {
                let at = format!(
                    "{}: {}/{}",
                    rendered.name,
                    name(workload),
                    container["name"].as_str().unwrap_or("?")
                );
                let context = &container["securityContext"];
                // A container's own setting wins over the pod's.
                let setting = |key: &str| -> &Value {
                    if context[key].is_null() {
                        &pod_context[key]
                    } else {
                        &context[key]
                    }
                };
                let uid = if is_baton(container) {
                    BATON_UID
                } else {
                    REDIS_UID
                };
                if setting("runAsNonRoot") != &Value::Bool(true) {
                    problems.push(format!("{at}: runAsNonRoot is not true"));
                }
                if setting("runAsUser").as_i64() != Some(uid)
                    || setting("runAsGroup").as_i64() != Some(uid)
                {
                    problems.push(format!("{at}: does not run as user and group {uid}"));
                }
                if str_at(setting("seccompProfile"), "/type") != Some("RuntimeDefault") {
                    problems.push(format!("{at}: seccomp profile is not RuntimeDefault"));
                }
                if context["readOnlyRootFilesystem"] != true {
                    problems.push(format!("{at}: root filesystem is not read-only"));
                }
                if context["allowPrivilegeEscalation"] != false {
                    problems.push(format!("{at}: allowPrivilegeEscalation is not false"));
                }
                if context["privileged"] == true {
                    problems.push(format!("{at}: privileged"));
                }
                let dropped = context["capabilities"]["drop"]
                    .as_array()
                    .is_some_and(|drop| drop.iter().any(|c| c == "ALL"));
                if !dropped {
                    problems.push(format!("{at}: capabilities are not all dropped"));
                }
                if context["capabilities"]["add"]
                    .as_array()
                    .is_some_and(|add| !add.is_empty())
                {
                    problems.push(format!("{at}: adds capabilities"));
                }
                for limit in ["cpu", "memory"] {
                    for kind in ["requests", "limits"] {
                        if container["resources"][kind][limit].is_null() {
                            problems.push(format!("{at}: no {limit} in resources.{kind}"));
                        }
                    }
                }
            }
            for key in ["hostNetwork", "hostPID", "hostIPC"] {
                if pod[key] == true {
                    problems.push(format!("{}: {} uses {key}", rendered.name, name(workload)));
                }
            }
            // Writable space is an emptyDir or a volume claim, never the node's disk.
            for volume in pod["volumes"].as_array().into_iter().flatten() {
                if !volume["hostPath"].is_null() {
                    problems.push(format!(
                        "{}: {} mounts a hostPath",
                        rendered.name,
                        name(workload)
                    ));
                }
            }
        }
    }
    assert_none("containers are not locked down", problems);
}

#[test]
fn no_pod_gets_a_service_account_token_or_service_variables() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for account in rendered.of_kind("ServiceAccount") {
            if account["automountServiceAccountToken"] != false {
                problems.push(format!(
                    "{}: ServiceAccount {} mounts its token",
                    rendered.name,
                    name(account)
                ));
            }
        }
        for workload in rendered.workloads() {
            let pod = pod_spec(workload);
            if pod["enableServiceLinks"] != false {
                problems.push(format!(
                    "{}: {} gets a variable per Service (enableServiceLinks is not false)",
                    rendered.name,
                    name(workload)
                ));
            }
            if pod["automountServiceAccountToken"] != false {
                problems.push(format!(
                    "{}: {} does not set automountServiceAccountToken: false",
                    rendered.name,
                    name(workload)
                ));
            }
            match pod["serviceAccountName"].as_str() {
                Some(account) if rendered.get("ServiceAccount", account).is_some() => {}
                other => problems.push(format!(
                    "{}: {} runs as ServiceAccount {other:?}, not one of the manifests'",
                    rendered.name,
                    name(workload)
                )),
            }
        }
    }
    assert_none("service account tokens", problems);
}

/// Whether a pod (`pod_labels`, in a namespace labelled `namespace_labels`, or in Baton's own
/// when `None`) may open `port` on `target`'s pods, by the rendered NetworkPolicies.
fn may_connect(
    rendered: &Rendered,
    namespace_labels: Option<&BTreeMap<String, String>>,
    pod_labels_of_source: &BTreeMap<String, String>,
    target: &Value,
    port: i64,
) -> bool {
    let target_labels = pod_labels(target);
    let policies: Vec<&Value> = rendered
        .of_kind("NetworkPolicy")
        .into_iter()
        .filter(|policy| {
            selects(&policy["spec"]["podSelector"], &target_labels)
                && policy["spec"]["policyTypes"]
                    .as_array()
                    .is_none_or(|types| types.iter().any(|t| t == "Ingress"))
        })
        .collect();
    if policies.is_empty() {
        return true;
    }
    policies.iter().any(|policy| {
        policy["spec"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let port_ok = rule["ports"]
                    .as_array()
                    .is_none_or(|ports| ports.iter().any(|p| p["port"].as_i64() == Some(port)));
                let peer_ok = rule["from"].as_array().is_none_or(|peers| {
                    peers.iter().any(|peer| {
                        let namespace_ok = match (&peer["namespaceSelector"], namespace_labels) {
                            (Value::Null, None) => true,
                            (Value::Null, Some(_)) => false,
                            (selector, Some(labels)) => selects(selector, labels),
                            // Baton's own namespace, as a namespaceSelector sees it.
                            (selector, None) => selects(
                                selector,
                                &BTreeMap::from([(
                                    "kubernetes.io/metadata.name".to_owned(),
                                    "baton".to_owned(),
                                )]),
                            ),
                        };
                        namespace_ok
                            && (peer["podSelector"].is_null()
                                || selects(&peer["podSelector"], pod_labels_of_source))
                            && peer["ipBlock"].is_null()
                    })
                });
                port_ok && peer_ok
            })
    })
}

#[test]
fn network_policies_let_only_coordinators_reach_redis_and_workers_and_clients_the_coordinators() {
    let mut problems = Vec::new();
    let client = BTreeMap::from([("baton-client".to_owned(), "true".to_owned())]);
    let stranger = BTreeMap::from([("app".to_owned(), "something-else".to_owned())]);
    let monitoring = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "monitoring".to_owned(),
    )]);
    let elsewhere = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        "default".to_owned(),
    )]);
    for rendered in installations() {
        let coordinators = rendered.expect_component("coordinator");
        let workers = rendered.expect_component("worker");
        let stores = rendered.by_component("store");
        let mut expect = |allowed: bool,
                          from: &str,
                          ns: Option<&BTreeMap<String, String>>,
                          labels: &BTreeMap<String, String>,
                          to: &Value,
                          port: i64| {
            if may_connect(rendered, ns, labels, to, port) != allowed {
                problems.push(format!(
                    "{}: {from} {} reach {}:{port}",
                    rendered.name,
                    if allowed { "cannot" } else { "can" },
                    name(to)
                ));
            }
        };
        for coordinator in &coordinators {
            for worker in &workers {
                expect(
                    true,
                    &format!("worker {}", name(worker)),
                    None,
                    &pod_labels(worker),
                    coordinator,
                    50051,
                );
            }
            expect(
                true,
                "a client pod labelled baton-client",
                None,
                &client,
                coordinator,
                50051,
            );
            expect(
                true,
                "a client pod in another namespace",
                Some(&elsewhere),
                &client,
                coordinator,
                50051,
            );
            expect(
                false,
                "an unlabelled pod",
                None,
                &stranger,
                coordinator,
                50051,
            );
            expect(
                true,
                "Prometheus",
                Some(&monitoring),
                &stranger,
                coordinator,
                9464,
            );
            expect(
                false,
                "an unlabelled pod",
                None,
                &stranger,
                coordinator,
                9464,
            );
        }
        for worker in &workers {
            expect(
                true,
                "Prometheus",
                Some(&monitoring),
                &stranger,
                worker,
                9465,
            );
            expect(false, "an unlabelled pod", None, &stranger, worker, 9465);
            for coordinator in &coordinators {
                expect(
                    false,
                    "a coordinator",
                    None,
                    &pod_labels(coordinator),
                    worker,
                    9465,
                );
            }
        }
        for store in &stores {
            for coordinator in &coordinators {
                expect(
                    true,
                    "a coordinator",
                    None,
                    &pod_labels(coordinator),
                    store,
                    6379,
                );
            }
            for worker in &workers {
                expect(false, "a worker", None, &pod_labels(worker), store, 6379);
            }
            expect(false, "a client", None, &client, store, 6379);
            expect(
                false,
                "Prometheus",
                Some(&monitoring),
                &stranger,
                store,
                6379,
            );
        }
        for workload in rendered.workloads() {
            let covered = rendered
                .of_kind("NetworkPolicy")
                .iter()
                .any(|policy| selects(&policy["spec"]["podSelector"], &pod_labels(workload)));
            if !covered {
                problems.push(format!(
                    "{}: no NetworkPolicy selects {}",
                    rendered.name,
                    name(workload)
                ));
            }
        }
    }
    assert_none("network policies", problems);
}

// ---------------------------------------------------------------------------------------------
// Probes and shutdown
// ---------------------------------------------------------------------------------------------

#[test]
fn coordinators_and_workers_are_probed_on_readyz_and_healthz_of_their_metrics_port() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for workload in rendered.workloads() {
            for container in containers(workload) {
                let at = format!("{}: {}", rendered.name, name(workload));
                for probe in ["readinessProbe", "livenessProbe"] {
                    if container[probe].is_null() {
                        problems.push(format!("{at}: no {probe}"));
                    }
                }
                if !is_baton(container) {
                    continue;
                }
                let Some(listen) = flag(container, "--metrics-listen") else {
                    problems.push(format!("{at}: --metrics-listen is not given explicitly"));
                    continue;
                };
                let metrics_port: i64 = listen.rsplit(':').next().unwrap().parse().unwrap();
                if !listen.starts_with("0.0.0.0:") {
                    problems.push(format!(
                        "{at}: metrics listen on {listen}, not on every address"
                    ));
                }
                if port_number(container, "http") != Some(metrics_port) {
                    problems.push(format!(
                        "{at}: the port named http is not --metrics-listen's {metrics_port}"
                    ));
                }
                for (probe, path) in [
                    ("readinessProbe", "/readyz"),
                    ("livenessProbe", "/healthz"),
                    ("startupProbe", "/healthz"),
                ] {
                    let get = &container[probe]["httpGet"];
                    if probe == "startupProbe" && container[probe].is_null() {
                        continue;
                    }
                    if get["path"] != path {
                        problems.push(format!("{at}: {probe} is not an HTTP GET of {path}"));
                    }
                    if probe_port(container, &get["port"]) != Some(metrics_port) {
                        problems.push(format!(
                            "{at}: {probe} is not on the metrics port {metrics_port}"
                        ));
                    }
                    if get["scheme"]
                        .as_str()
                        .is_some_and(|scheme| scheme != "HTTP")
                    {
                        problems.push(format!("{at}: {probe} is not plain HTTP"));
                    }
                }
            }
        }
    }
    assert_none("probes", problems);
}

#[test]
fn pods_are_given_longer_to_stop_than_they_take_to_drain() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for worker in rendered.expect_component("worker") {
            let container = the_container(worker);
            let grace = pod_spec(worker)["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30);
            let drain: i64 = flag(container, "--grace-seconds")
                .map(|seconds| seconds.parse().expect("--grace-seconds is a number"))
                .unwrap_or(30);
            let needed = drain + pre_stop_sleep(container);
            if grace <= needed {
                problems.push(format!(
                    "{}: {} is killed after {grace} s but may take {needed} s (preStop, then --grace-seconds {drain})",
                    rendered.name,
                    name(worker)
                ));
            }
        }
        for coordinator in rendered.expect_component("coordinator") {
            let container = the_container(coordinator);
            let grace = pod_spec(coordinator)["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30);
            let needed = pre_stop_sleep(container) + COORDINATOR_DRAIN_SECONDS;
            if grace <= needed {
                problems.push(format!(
                    "{}: {} is killed after {grace} s, sooner than its preStop and drain ({needed} s)",
                    rendered.name,
                    name(coordinator)
                ));
            }
            if container["lifecycle"]["preStop"]["exec"].is_object() {
                problems.push(format!(
                    "{}: the image has no shell for an exec preStop",
                    rendered.name
                ));
            }
        }
    }
    assert_none("termination grace periods", problems);
}

#[test]
fn production_runs_coordinators_that_no_drain_can_all_take_away() {
    let production = overlay("overlays/production");
    let coordinators = production.by_component("coordinator");
    assert_eq!(coordinators.len(), 1, "one coordinator Deployment");
    let coordinator = coordinators[0];
    let replicas = coordinator["spec"]["replicas"].as_i64().unwrap_or(1);
    assert!(
        replicas >= 2,
        "production runs {replicas} coordinator(s), not two or more"
    );
    let spread = pod_spec(coordinator)["topologySpreadConstraints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        spread.iter().any(
            |constraint| constraint["topologyKey"] == "kubernetes.io/hostname"
                && selects(&constraint["labelSelector"], &pod_labels(coordinator))
        ),
        "the coordinators are not spread over nodes"
    );
    let budgets: Vec<&Value> = production
        .of_kind("PodDisruptionBudget")
        .into_iter()
        .filter(|budget| selects(&budget["spec"]["selector"], &pod_labels(coordinator)))
        .collect();
    assert_eq!(
        budgets.len(),
        1,
        "one PodDisruptionBudget selects the coordinators"
    );
    assert_eq!(
        budgets[0]["spec"]["minAvailable"], 1,
        "the budget keeps one coordinator up"
    );

    // Nowhere may a budget forbid every eviction (minAvailable as high as the replicas): that
    // blocks node drains for good.
    let mut problems = Vec::new();
    for rendered in installations() {
        for budget in rendered.of_kind("PodDisruptionBudget") {
            for workload in rendered.workloads() {
                if !selects(&budget["spec"]["selector"], &pod_labels(workload)) {
                    continue;
                }
                let replicas = workload["spec"]["replicas"].as_i64().unwrap_or(1);
                let min = budget["spec"]["minAvailable"].as_i64().unwrap_or(0);
                if min >= replicas {
                    problems.push(format!(
                        "{}: budget {} keeps {min} of {replicas} pods of {}: no drain can proceed",
                        rendered.name,
                        name(budget),
                        name(workload)
                    ));
                }
            }
        }
    }
    assert_none("disruption budgets", problems);
}

// ---------------------------------------------------------------------------------------------
// What runs
// ---------------------------------------------------------------------------------------------

#[test]
fn redis_keeps_its_append_only_file_on_a_volume_claim() {
    let mut problems = Vec::new();
    for rendered in installations() {
        let stores = rendered.by_component("store");
        let external = rendered.name.contains("external-redis");
        if external {
            if !stores.is_empty() {
                problems.push(format!(
                    "{}: external-redis still runs a Redis",
                    rendered.name
                ));
            }
            continue;
        }
        if stores.len() != 1 {
            problems.push(format!(
                "{}: {} Redis workloads, not one",
                rendered.name,
                stores.len()
            ));
            continue;
        }
        let redis = stores[0];
        let container = the_container(redis);
        let at = format!("{}: {}", rendered.name, name(redis));
        if redis["kind"] != "StatefulSet" {
            problems.push(format!("{at}: not a StatefulSet"));
        }
        if container["image"] != "redis:7.2-bookworm" {
            problems.push(format!(
                "{at}: image {} is not redis:7.2-bookworm",
                container["image"]
            ));
        }
        if container["command"] != serde_json::json!(["redis-server"]) {
            problems.push(format!("{at}: command is not [\"redis-server\"]"));
        }
        if flag(container, "--appendonly") != Some("yes") {
            problems.push(format!("{at}: AOF is not on"));
        }
        if !matches!(
            flag(container, "--appendfsync"),
            Some("always" | "everysec")
        ) {
            problems.push(format!("{at}: appendfsync is not chosen"));
        }
        let dir = flag(container, "--dir").unwrap_or_default();
        let claims = redis["spec"]["volumeClaimTemplates"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mounted_claim = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|mount| {
                mount["mountPath"] == dir
                    && claims
                        .iter()
                        .any(|claim| claim["metadata"]["name"] == mount["name"])
            });
        if dir.is_empty() || !mounted_claim {
            problems.push(format!("{at}: --dir {dir:?} is not a volume claim"));
        }
        let service = rendered.get(
            "Service",
            str_at(redis, "/spec/serviceName").unwrap_or_default(),
        );
        match service {
            Some(service) if service["spec"]["clusterIP"] == "None" => {}
            _ => problems.push(format!("{at}: no headless Service by its serviceName")),
        }
    }
    assert_none("Redis", problems);
}

#[test]
fn coordinators_are_named_by_their_pod_and_serve_clients_through_a_service() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for coordinator in rendered.expect_component("coordinator") {
            let container = the_container(coordinator);
            let at = format!("{}: {}", rendered.name, name(coordinator));
            if args(container).first() != Some(&"coordinator") {
                problems.push(format!("{at}: does not run `baton coordinator`"));
            }
            let id = env(container, "BATON_COORDINATOR_ID");
            if id.and_then(|id| str_at(id, "/valueFrom/fieldRef/fieldPath"))
                != Some("metadata.name")
            {
                problems.push(format!("{at}: BATON_COORDINATOR_ID is not the pod's name"));
            }
            if env(container, "BATON_AUTH_TOKENS").is_none() {
                problems.push(format!(
                    "{at}: no principals (BATON_AUTH_TOKENS): protected mode refuses other pods"
                ));
            }
            let grpc = port_number(container, "grpc");
            let serves = rendered.of_kind("Service").into_iter().any(|service| {
                selects(
                    &serde_json::json!({"matchLabels": service["spec"]["selector"]}),
                    &pod_labels(coordinator),
                ) && service["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|port| {
                        port["port"] == 50051 && probe_port(container, &port["targetPort"]) == grpc
                    })
            });
            if grpc != Some(50051) || !serves {
                problems.push(format!(
                    "{at}: no Service sends port 50051 to its gRPC port"
                ));
            }
        }
    }
    assert_none("coordinators", problems);
}

#[test]
fn each_worker_pool_scales_on_the_queue_of_its_own_agents() {
    let mut problems = Vec::new();
    let workflow: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/feature-development/workflow.json"))
            .unwrap(),
    )
    .unwrap();
    let mut needed = BTreeSet::new();
    collect_agents(&workflow, &mut needed);
    for rendered in installations() {
        let workers = rendered.by_component("worker");
        if workers.is_empty() {
            problems.push(format!("{}: no worker pool", rendered.name));
        }
        let mut served = BTreeSet::new();
        for worker in &workers {
            let agents = pool_agents(rendered, worker);
            served.extend(agents.iter().cloned());
            let at = format!("{}: {}", rendered.name, name(worker));
            let container = the_container(worker);
            let model_keys = container["envFrom"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|source| source["secretRef"]["optional"] == true);
            if !model_keys {
                problems.push(format!("{at}: takes no model keys from an optional Secret"));
            }
            let token = env(container, "BATON_TOKEN");
            if token
                .and_then(|token| str_at(token, "/valueFrom/secretKeyRef/name"))
                .is_none()
            {
                problems.push(format!("{at}: BATON_TOKEN is not from a Secret"));
            }
            if rendered.name == "overlays/dev" {
                continue;
            }
            let scaled: Vec<&Value> = rendered
                .of_kind("ScaledObject")
                .into_iter()
                .filter(|scaled| str_at(scaled, "/spec/scaleTargetRef/name") == Some(name(worker)))
                .collect();
            let autoscalers: Vec<&Value> = rendered
                .of_kind("HorizontalPodAutoscaler")
                .into_iter()
                .filter(|hpa| str_at(hpa, "/spec/scaleTargetRef/name") == Some(name(worker)))
                .collect();
            if scaled.len() + autoscalers.len() != 1 {
                problems.push(format!(
                    "{at}: {} ScaledObjects and {} HPAs scale it, not one",
                    scaled.len(),
                    autoscalers.len()
                ));
                continue;
            }
            if !worker["spec"]["replicas"].is_null() {
                problems.push(format!("{at}: sets replicas, which its autoscaler owns"));
            }
            // Both signals, each naming exactly this pool's agents.
            let signals: Vec<(String, BTreeSet<String>)> = if let Some(scaled) = scaled.first() {
                if scaled["spec"]["minReplicaCount"].is_null()
                    || scaled["spec"]["maxReplicaCount"].is_null()
                {
                    problems.push(format!(
                        "{at}: the ScaledObject leaves min or max replicas to defaults"
                    ));
                }
                scaled["spec"]["triggers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|trigger| trigger["type"] == "prometheus")
                    .filter_map(|trigger| str_at(trigger, "/metadata/query"))
                    .map(|query| (query.to_owned(), query_agents(query)))
                    .collect()
            } else {
                autoscalers[0]["spec"]["metrics"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|metric| metric["type"] == "External")
                    .map(|metric| {
                        let metric = &metric["external"]["metric"];
                        let agents = metric["selector"]["matchExpressions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter(|e| e["key"] == "agent" && e["operator"] == "In")
                            .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect();
                        (
                            metric["name"].as_str().unwrap_or_default().to_owned(),
                            agents,
                        )
                    })
                    .collect()
            };
            for metric in ["baton_queue_depth", "baton_queue_oldest_age_seconds"] {
                match signals.iter().find(|(query, _)| query.contains(metric)) {
                    None => problems.push(format!("{at}: does not scale on {metric}")),
                    Some((query, named)) if named != &agents => problems.push(format!(
                        "{at}: `{query}` names agents {named:?}, the pool serves {agents:?}"
                    )),
                    Some(_) => {}
                }
            }
        }
        let missing: Vec<&String> = needed.difference(&served).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "{}: no pool serves {missing:?} of the feature-development workflow",
                rendered.name
            ));
        }
    }
    assert_none("worker pools", problems);
}

fn collect_agents(value: &Value, into: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if let (Some(Value::String(kind)), Some(Value::String(agent))) =
                (map.get("type"), map.get("agent"))
                && kind == "agent"
            {
                into.insert(agent.clone());
            }
            map.values().for_each(|v| collect_agents(v, into));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_agents(v, into)),
        _ => {}
    }
}

#[test]
fn prometheus_scrapes_coordinators_and_workers_in_production() {
    let production = overlay("overlays/production");
    let monitors = production.of_kind("PodMonitor");
    for component in ["coordinator", "worker"] {
        for workload in production.expect_component(component) {
            assert!(
                monitors
                    .iter()
                    .any(|monitor| selects(&monitor["spec"]["selector"], &pod_labels(workload))),
                "no PodMonitor scrapes {}",
                name(workload)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets, TLS, images, telemetry
// ---------------------------------------------------------------------------------------------

#[test]
fn the_dev_tokens_are_the_ones_its_principals_name() {
    let secrets = manifests().join("overlays/dev/secrets");
    let principals = std::fs::read_to_string(secrets.join("principals.toml")).unwrap();
    assert!(
        principals.contains("DEV ONLY"),
        "the dev principals are not labelled dev-only"
    );
    for (file, role) in [("worker-token", "\"worker\""), ("ci-token", "\"submit\"")] {
        let token = std::fs::read_to_string(secrets.join(file)).unwrap();
        assert_eq!(
            token.trim(),
            token,
            "{file} ends in whitespace: BATON_TOKEN would carry it and be refused"
        );
        let sha = hex::encode(Sha256::digest(token.as_bytes()));
        let table = principals
            .split("\n[")
            .find(|table| table.contains(&sha))
            .unwrap_or_else(|| panic!("no dev principal has the SHA-256 of {file}"));
        assert!(
            table.contains(role),
            "the principal of {file} lacks the role {role}"
        );
    }
    // The generated Secrets are what the pods reference.
    let dev = overlay("overlays/dev");
    let mut problems = Vec::new();
    for workload in dev.workloads() {
        for container in containers(workload) {
            for entry in container["env"].as_array().into_iter().flatten() {
                if let Some(secret) = str_at(entry, "/valueFrom/secretKeyRef/name")
                    && dev.get("Secret", secret).is_none()
                {
                    problems.push(format!(
                        "{} reads Secret {secret}, which dev does not make",
                        name(workload)
                    ));
                }
            }
        }
        for volume in pod_spec(workload)["volumes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(secret) = str_at(volume, "/secret/secretName")
                && dev.get("Secret", secret).is_none()
            {
                problems.push(format!(
                    "{} mounts Secret {secret}, which dev does not make",
                    name(workload)
                ));
            }
        }
    }
    assert_none("the dev overlay's secrets", problems);
}

#[test]
fn production_serves_tls_from_cert_manager_and_commits_no_secret() {
    let production = overlay("overlays/production");
    assert!(
        production.of_kind("Secret").is_empty(),
        "production renders Secrets: they must be created by the operator, not committed"
    );
    let coordinator = the_container(production.by_component("coordinator")[0]);
    let coordinator_workload = production.by_component("coordinator")[0];
    let mut served_secret = None;
    for (variable, file) in [("BATON_TLS_CERT", "tls.crt"), ("BATON_TLS_KEY", "tls.key")] {
        let path = env(coordinator, variable)
            .and_then(|entry| entry["value"].as_str())
            .unwrap_or_else(|| panic!("the coordinator has no {variable}"));
        let (volume, name_in_volume) = volume_of(coordinator_workload, coordinator, path)
            .unwrap_or_else(|| panic!("{variable}={path} is in no mounted volume"));
        assert_eq!(
            name_in_volume, file,
            "{variable} is not the Secret's {file}"
        );
        served_secret = str_at(volume, "/secret/secretName");
    }
    let served_secret = served_secret.expect("the certificate is mounted from a Secret");
    let certificate = production
        .of_kind("Certificate")
        .into_iter()
        .find(|certificate| str_at(certificate, "/spec/secretName") == Some(served_secret))
        .unwrap_or_else(|| panic!("no cert-manager Certificate makes {served_secret}"));
    let redis_url = env(coordinator, "BATON_REDIS_URL").expect("BATON_REDIS_URL");
    assert!(
        redis_url["value"].is_null() && redis_url["valueFrom"]["secretKeyRef"].is_object(),
        "production's Redis URL is not from a Secret: {redis_url}"
    );
    for worker in production.expect_component("worker") {
        let container = the_container(worker);
        let url = env(container, "BATON_COORDINATOR")
            .and_then(|e| e["value"].as_str())
            .unwrap_or_default();
        let host = url
            .strip_prefix("https://")
            .unwrap_or_else(|| panic!("{} dials {url:?}, not https://", name(worker)))
            .split(':')
            .next()
            .unwrap();
        assert!(
            certificate["spec"]["dnsNames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == host),
            "the certificate does not name {host}, which {} dials",
            name(worker)
        );
        let ca = env(container, "BATON_TLS_CA")
            .and_then(|e| e["value"].as_str())
            .unwrap_or_default();
        let (volume, file) = volume_of(worker, container, ca).unwrap_or_else(|| {
            panic!(
                "{}: BATON_TLS_CA={ca:?} is in no mounted volume",
                name(worker)
            )
        });
        assert_eq!(
            str_at(volume, "/secret/secretName"),
            Some(served_secret),
            "workers trust another CA"
        );
        let items = volume["secret"]["items"]
            .as_array()
            .expect("workers mount only ca.crt");
        assert!(
            items.len() == 1 && items[0]["key"] == "ca.crt" && items[0]["path"] == file,
            "workers get more of the TLS Secret than its ca.crt"
        );
    }
}

#[test]
fn images_are_named_once_and_pinned_by_each_overlay() {
    let mut problems = Vec::new();
    for rendered in installations() {
        for workload in rendered.workloads() {
            for container in containers(workload) {
                let image = container["image"].as_str().unwrap_or_default();
                if !is_baton(container) {
                    continue;
                }
                let expected_ok = if rendered.name == "overlays/dev" {
                    image == "baton:dev"
                } else {
                    image.contains('/') && (image.contains(':') || image.contains('@'))
                };
                if !expected_ok {
                    problems.push(format!(
                        "{}: {} runs image {image}",
                        rendered.name,
                        name(workload)
                    ));
                }
            }
        }
        for object in &rendered.objects {
            let object_labels = labels(&object["metadata"]["labels"]);
            if object_labels
                .get("app.kubernetes.io/part-of")
                .map(String::as_str)
                != Some("baton")
            {
                problems.push(format!(
                    "{}: {} {} lacks app.kubernetes.io/part-of=baton",
                    rendered.name,
                    kind(object),
                    name(object)
                ));
            }
        }
        for workload in rendered.workloads() {
            let pod = pod_labels(workload);
            for key in ["app.kubernetes.io/name", COMPONENT] {
                if !pod.contains_key(key) {
                    problems.push(format!(
                        "{}: {}'s pods lack {key}",
                        rendered.name,
                        name(workload)
                    ));
                }
            }
        }
    }
    assert_none("images and labels", problems);
}

#[test]
fn production_exports_traces_to_the_collector_with_the_standard_variables() {
    let production = overlay("overlays/production");
    for component in ["coordinator", "worker"] {
        for workload in production.expect_component(component) {
            let container = the_container(workload);
            let endpoint = env(container, "OTEL_EXPORTER_OTLP_ENDPOINT")
                .and_then(|e| e["value"].as_str())
                .unwrap_or_else(|| panic!("{} has no OTEL_EXPORTER_OTLP_ENDPOINT", name(workload)));
            assert_eq!(
                endpoint,
                "http://otel-collector:4317",
                "{}'s collector",
                name(workload)
            );
            let attributes = env(container, "OTEL_RESOURCE_ATTRIBUTES")
                .and_then(|e| e["value"].as_str())
                .unwrap_or_default();
            assert!(
                attributes.contains("k8s.pod.name="),
                "{}: spans do not name their pod",
                name(workload)
            );
        }
    }
}
