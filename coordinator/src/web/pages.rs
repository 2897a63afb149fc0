//! The pages: one HTML document for every page (its script routes on the path), and the
//! assets it loads, embedded at build time.
//!
//! Every answer carries a strict Content-Security-Policy: nothing but the coordinator's own
//! scripts, styles and API, no inline script, no framing. Run data reaches the page only as
//! text (the script never writes HTML from it), and the policy is the second fence.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// A module of `assets/js/`, served under its file's name.
macro_rules! module {
    ($file:literal) => {
        ($file, JS, include_str!(concat!("assets/js/", $file)))
    };
}

/// Every asset, by the name it is served under (`/assets/<name>`), with its content type.
/// The script is ES modules kept in `assets/js/` (app.js loads the rest through `import`) but
/// served flat beside the styles, so that their relative imports (`./dom.js`) resolve to
/// `/assets/dom.js`. A module missing here is a 404 and a page that never starts: the tests
/// below check every file of `assets/js/` and every import is listed.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.css", CSS, include_str!("assets/app.css")),
    ("favicon.svg", SVG, include_str!("assets/favicon.svg")),
    module!("api.js"),
    module!("app.js"),
    module!("approvals.js"),
    module!("config.js"),
    module!("dom.js"),
    module!("format.js"),
    module!("graph.js"),
    module!("graph_shapes.js"),
    module!("live_output.js"),
    module!("memory.js"),
    module!("memory_views.js"),
    module!("page.js"),
    module!("run_actions.js"),
    module!("run_live.js"),
    module!("run_page.js"),
    module!("run_summary.js"),
    module!("runs_page.js"),
    module!("session.js"),
    module!("step_detail.js"),
    module!("step_panel.js"),
    module!("waits.js"),
    module!("widgets.js"),
];

const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
form-action 'self'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            // Small, and new with each coordinator version: always checked.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, ..)| *name == file) {
        Some((_, content_type, body)) => page(content_type, body),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use axum::body::to_bytes;

    use super::*;

    fn served(name: &str) -> Option<(&'static str, &'static str)> {
        ASSETS
            .iter()
            .find(|(served, ..)| *served == name)
            .map(|(_, content_type, body)| (*content_type, *body))
    }

    /// What `module` imports, as written: the quoted name ending an `import` line, or ending
    /// the `} from '…'` line of an import spread over lines.
    fn imports(module: &str) -> Vec<&str> {
        module
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with("import ") || line.starts_with("} from "))
            .map(|line| {
                let unquoted = line.trim_end_matches(';').trim_end_matches(['\'', '"']);
                let opening = unquoted.rfind(['\'', '"']).map_or(0, |quote| quote + 1);
                &unquoted[opening..]
            })
            .collect()
    }

    #[test]
    fn every_module_in_the_js_folder_is_served_as_it_is() {
        let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/web/assets/js");
        let mut modules = BTreeSet::new();
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            assert!(
                name.ends_with(".js"),
                "{name}: only modules belong in assets/js"
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let (content_type, body) =
                served(&name).unwrap_or_else(|| panic!("{name}: not in ASSETS"));
            assert_eq!(content_type, JS, "{name}");
            assert!(
                body == text,
                "{name}: ASSETS serves another file under its name"
            );
            modules.insert(name);
        }
        let listed: BTreeSet<String> = ASSETS
            .iter()
            .filter(|(_, content_type, _)| *content_type == JS)
            .map(|(name, ..)| (*name).to_owned())
            .collect();
        assert_eq!(listed, modules);
    }

    #[test]
    fn every_import_names_a_served_module_and_every_module_is_imported() {
        let mut reached = BTreeSet::from(["app.js"]);
        let mut unread = vec!["app.js"];
        while let Some(module) = unread.pop() {
            let (_, text) = served(module).unwrap();
            for import in imports(text) {
                let name = import.strip_prefix("./").unwrap_or_else(|| {
                    panic!("{module} imports {import:?}: not a module beside it")
                });
                assert!(!name.contains('/'), "{module} imports {import:?}: not flat");
                let served = served(name).map(|(content_type, _)| content_type);
                assert_eq!(served, Some(JS), "{module} imports {import:?}: not served");
                if reached.insert(name) {
                    unread.push(name);
                }
            }
        }
        for (name, content_type, _) in ASSETS {
            if *content_type == JS {
                assert!(reached.contains(name), "{name}: app.js never imports it");
            }
        }
    }

    #[test]
    fn the_index_loads_only_served_assets() {
        let mut loaded = 0;
        for (i, _) in INDEX.match_indices("\"/assets/") {
            let rest = &INDEX[i + "\"/assets/".len()..];
            let name = &rest[..rest.find('"').unwrap()];
            assert!(served(name).is_some(), "index.html loads {name}");
            loaded += 1;
        }
        assert!(
            loaded >= 3,
            "index.html loads the script, the styles and the icon"
        );
        assert!(INDEX.contains(r#"<script type="module" src="/assets/app.js">"#));
    }

    #[tokio::test]
    async fn a_module_is_served_as_javascript_under_the_policy_and_an_unknown_name_is_not() {
        let response = asset(Path("graph.js".to_owned())).await;
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(headers[header::CONTENT_TYPE], JS);
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], POLICY);
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert!(body.starts_with(b"// The run's workflow as a graph"));

        for unknown in ["nope.js", "js", "index.html", "app.js.map"] {
            let response = asset(Path(unknown.to_owned())).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{unknown}");
        }
    }
}
