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
/// `/assets/dom.js`. A module missing here is a 404 and a page that never starts.
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
