//! `zflow ui`: a web page of one recipe and its store, served by zflow itself.
//!
//! The page (`assets/`: one HTML file, one script, one style sheet, compiled into the
//! binary; nothing is fetched from elsewhere) shows the stage graph coloured by state, what a
//! stage is (config, identity, why it would run, its log, its outputs), the training curves
//! of every phase as they grow, the restarts, rollbacks and preflight verdicts, and the
//! evaluation report.
//!
//! Everything comes from the store, as `zflow status`, `why`, `logs` and `report` read it:
//! the server holds no state of its own, so `zflow ui` beside a running `zflow run` (or on
//! another machine that mounts the store) shows the same as `zflow run --ui`.
//!
//! - [`views`]: the JSON the page reads (`/api/graph`, `/api/stage/{name}`, `/api/report`);
//! - [`live`]: the poller and the server-sent events (`/api/events`);
//! - [`layout`]: where each stage is drawn;
//! - [`auth`]: the token every request must carry.

#![warn(missing_docs)]

pub mod auth;
pub mod layout;
pub mod live;
pub mod views;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;
use zflow_pipeline::Engine;

use auth::Access;

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to bind (loopback unless the user asks for another).
    pub host: IpAddr,
    /// The port (0: any free one).
    pub port: u16,
    /// The access token (default: a fresh random one).
    pub token: Option<String>,
    /// How often the store is re-read.
    pub poll: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8265,
            token: None,
            poll: Duration::from_secs(1),
        }
    }
}

/// A bound server, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    url: String,
}

#[derive(Clone)]
struct App {
    engine: Arc<Engine>,
    live: watch::Receiver<Option<Arc<live::Snapshot>>>,
}

/// Binds the page of `engine`'s recipe and starts polling its store.
pub async fn bind(engine: Arc<Engine>, opts: &Options) -> Result<Server> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(opts.host, opts.port))
        .await
        .with_context(|| format!("binding the ui to {}:{}", opts.host, opts.port))?;
    let addr = listener.local_addr()?;
    let access = Access::new(opts.token.clone(), addr.port())?;
    let host = if addr.ip().is_unspecified() {
        zflow_pipeline::lease::hostname()
    } else {
        addr.ip().to_string()
    };
    let url = format!("http://{host}:{}/?token={}", addr.port(), access.token());
    let app = App {
        live: live::start(engine.clone(), opts.poll),
        engine,
    };
    let router = Router::new()
        .route("/", get(|| asset("index.html")))
        .route("/app.js", get(|| asset("app.js")))
        .route("/style.css", get(|| asset("style.css")))
        .route("/api/graph", get(graph))
        .route("/api/stage/{name}", get(stage))
        .route("/api/report", get(report))
        .route("/api/file/{stage}/{*path}", get(file))
        .route("/api/events", get(events))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(
            access,
            auth::require_token,
        ));
    Ok(Server {
        listener,
        router,
        url,
    })
}

impl Server {
    /// The page's address, token included.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves until the process ends.
    pub async fn run(self) -> Result<()> {
        axum::serve(self.listener, self.router)
            .await
            .context("serving the ui")
    }
}

/// The page's files, compiled in.
async fn asset(name: &str) -> Response {
    let (body, kind) = match name {
        "index.html" => (
            include_str!("../assets/index.html"),
            "text/html; charset=utf-8",
        ),
        "app.js" => (
            include_str!("../assets/app.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => (
            include_str!("../assets/style.css"),
            "text/css; charset=utf-8",
        ),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Runs `f` on the engine off the async threads (a plan reads and hashes files).
async fn blocking<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&Engine) -> Result<T> + Send + 'static,
) -> Result<T, Response> {
    let engine = app.engine.clone();
    match tokio::task::spawn_blocking(move || f(&engine)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err((StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response()),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()),
    }
}

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, what).into_response()
}

async fn graph(State(app): State<App>) -> Response {
    match blocking(&app, |e| Ok(views::graph(e))).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}

async fn stage(State(app): State<App>, Path(name): Path<String>) -> Response {
    let asked = name.clone();
    match blocking(&app, move |e| views::stage(e, &name)).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => not_found(format!("no stage named `{asked}` in this recipe")),
        Err(r) => r,
    }
}

async fn report(State(app): State<App>) -> Response {
    match blocking(&app, views::reports).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}

/// Bytes of a served file read at a time: what a download holds in memory, with the few
/// chunks in flight ([`FILE_CHUNKS_IN_FLIGHT`]).
const FILE_CHUNK: usize = 256 * 1024;
/// Chunks read ahead of the connection.
const FILE_CHUNKS_IN_FLIGHT: usize = 4;

async fn file(State(app): State<App>, Path((stage, path)): Path<(String, String)>) -> Response {
    let what = format!("{stage} has no complete output file `{path}`");
    let found = blocking(&app, move |e| Ok(views::output_file(e, &stage, &path))).await;
    let opened = match found {
        Ok(Ok(Some(opened))) => opened,
        Ok(Ok(None)) => return not_found(what),
        Ok(Err(refused)) => return (StatusCode::FORBIDDEN, format!("{refused:#}")).into_response(),
        Err(r) => return r,
    };
    let kind = match opened.path.extension().and_then(|e| e.to_str()) {
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("md" | "csv" | "tex" | "txt" | "log" | "jsonl" | "yaml") => {
            "text/plain; charset=utf-8"
        }
        _ => "application/octet-stream",
    };
    // Streamed: a reader thread sends chunks through a short queue, so a download holds a
    // few chunks in memory whatever the file's size (a file read whole took the server to
    // 843 MiB under 8 downloads of 100 MB).
    let (tx, rx) =
        tokio::sync::mpsc::channel::<std::io::Result<axum::body::Bytes>>(FILE_CHUNKS_IN_FLIGHT);
    let views::ServedFile { mut file, len, .. } = opened;
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        loop {
            let mut chunk = vec![0u8; FILE_CHUNK];
            let n = match file.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            chunk.truncate(n);
            if tx.blocking_send(Ok(chunk.into())).is_err() {
                return; // the client went away
            }
        }
    });
    let body = axum::body::Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|item| (item, rx))
    }));
    (
        [
            (header::CONTENT_TYPE, kind.to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            // Output files are shown, never run (an SVG may hold a script).
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'".to_string(),
            ),
        ],
        body,
    )
        .into_response()
}

async fn events(State(app): State<App>) -> impl IntoResponse {
    Sse::new(live::stream(app.live.clone())).keep_alive(KeepAlive::default())
}
