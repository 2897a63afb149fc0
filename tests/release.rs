//! The release workflow (`.github/workflows/release.yml`), linted offline as GitHub would read it
//! and as a reviewer would: GitHub's workflow schema (check-jsonschema's copy), shellcheck on
//! every `run:` script, and zizmor's security audits (actions pinned by commit, no credentials
//! left in artifacts, no template injection). And README.md's "Install" names exactly what its
//! first tag publishes. The tools come from PyPI into target/test-tools (scripts/test).
//!
//! actionlint itself is not used: its PyPI package downloads the binary from GitHub when it is
//! installed, which a machine that reaches only the package registries cannot do.

#[path = "support/images.rs"]
mod images;

use std::process::Command;

use images::{DOCKER_DEADLINE, root, run, tool};

const WORKFLOW: &str = ".github/workflows/release.yml";

fn said(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_release_workflow_is_valid_for_github() {
    let output = run(
        Command::new(tool("check-jsonschema"))
            .current_dir(root())
            .args(["--builtin-schema", "vendor.github-workflows", WORKFLOW]),
        DOCKER_DEADLINE,
    );
    assert!(output.status.success(), "{}", said(&output));
}

#[test]
fn the_release_workflow_passes_zizmor_s_audits() {
    let output = run(
        Command::new(tool("zizmor")).current_dir(root()).args([
            "--offline",
            "--format",
            "plain",
            WORKFLOW,
        ]),
        DOCKER_DEADLINE,
    );
    let said = said(&output);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("No findings"), "{said}");
}

/// Every `run:` script, with GitHub's `${{ ... }}` expressions made plain words, through
/// shellcheck as bash (the runners' default shell).
#[test]
fn every_run_script_passes_shellcheck() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    // ruamel.yaml comes with check-jsonschema, in the same venv.
    let python = tool("check-jsonschema").with_file_name("python3");
    let extract = r##"
import re, sys
from ruamel.yaml import YAML
workflow = YAML(typ="safe").load(open(sys.argv[1]))
n = 0
for job in workflow["jobs"].values():
    for step in job.get("steps", []):
        if "run" in step:
            script = re.sub(r"\$\{\{[^}]*\}\}", "EXPRESSION", step["run"])
            open(f"{sys.argv[2]}/step{n}.sh", "w").write("#!/usr/bin/env bash\n" + script)
            n += 1
print(n)
"##;
    let output = run(
        Command::new(&python)
            .current_dir(root())
            .args(["-c", extract, WORKFLOW])
            .arg(dir.path()),
        DOCKER_DEADLINE,
    );
    assert!(output.status.success(), "{}", said(&output));
    let scripts: usize = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        scripts >= 5,
        "only {scripts} run scripts found in {WORKFLOW}"
    );
    for n in 0..scripts {
        let script = dir.path().join(format!("step{n}.sh"));
        let checked = run(
            Command::new(tool("shellcheck")).arg(&script),
            DOCKER_DEADLINE,
        );
        assert!(
            checked.status.success(),
            "{}:\n{}\n{}",
            script.display(),
            std::fs::read_to_string(&script).unwrap_or_default(),
            said(&checked)
        );
    }
}

/// What README.md's "Install" says a tag publishes is what the workflow makes: the two
/// archives, the checksums file, the image and its two platforms.
#[test]
fn the_readme_names_what_a_tag_publishes() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let install = &readme[readme.find("## Install").expect("an Install section")..];
    let install = &install[..install[3..]
        .find("\n## ")
        .map_or(install.len(), |end| end + 3)];
    let workflow = std::fs::read_to_string(root().join(WORKFLOW)).expect("the workflow");
    for (readme_says, workflow_makes) in [
        (
            "baton-vX.Y.Z-x86_64-linux.tar.gz",
            "archive=\"baton-${GITHUB_REF_NAME}-${{ matrix.arch }}-linux.tar.gz\"",
        ),
        ("baton-vX.Y.Z-aarch64-linux.tar.gz", "- arch: aarch64"),
        ("SHA256SUMS", "> SHA256SUMS"),
        (
            "ghcr.io/<owner>/baton:X.Y.Z",
            "IMAGE: ghcr.io/${{ github.repository_owner }}/baton",
        ),
        ("`linux/amd64`", "platform: linux/amd64"),
        ("`linux/arm64`", "platform: linux/arm64"),
    ] {
        assert!(
            install.contains(readme_says),
            "README's Install does not name {readme_says}"
        );
        assert!(
            workflow.contains(workflow_makes),
            "{WORKFLOW} does not make {readme_says}"
        );
    }
    assert!(
        workflow.contains("tags: [\"v*\"]"),
        "the release runs on v* tags"
    );
}
