//! Logging: tracing to the console (above the progress bars) and, for events inside a
//! stage's span, into that stage's log file in the store.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::progress::Progress;
use crate::stage::StageLog;

/// Stage name -> its open log, for the stages running now.
fn open_logs() -> &'static Mutex<HashMap<String, StageLog>> {
    static LOGS: OnceLock<Mutex<HashMap<String, StageLog>>> = OnceLock::new();
    LOGS.get_or_init(Default::default)
}

/// Routes events in spans named `stage` (field `name`) to that stage's log while it runs.
pub(crate) fn attach_stage_log(name: &str, log: StageLog) {
    open_logs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), log);
}

/// Stops routing events to a stage's log.
pub(crate) fn detach_stage_log(name: &str) {
    open_logs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
}

/// Installs the global subscriber: console output filtered by `ZFLOW_LOG` (default `info`,
/// `warn` when quiet), stage files at `info`. Safe to call once per process.
pub fn init(progress: &Progress, quiet: bool) {
    let default = if quiet { "warn" } else { "info" };
    let filter = EnvFilter::try_from_env("ZFLOW_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let console = tracing_subscriber::fmt::layer()
        .with_writer(ConsoleWriter(progress.clone()))
        .event_format(ConsoleFormat)
        .with_filter(filter);
    // Stage files get INFO and up. Keeping every layer filtered matters for speed: the `log`
    // records of libraries (tokenizers logs per word at TRACE) are bridged into tracing, and
    // an unfiltered layer would make each of them a full dispatch (5x slower tokenization).
    let stage_files = StageFileLayer.with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    let _ = tracing_subscriber::registry()
        .with(console)
        .with(stage_files)
        .try_init();
}

/// Writes console logs with the progress bars suspended.
#[derive(Clone)]
struct ConsoleWriter(Progress);

impl<'a> MakeWriter<'a> for ConsoleWriter {
    type Writer = ConsoleLine;
    fn make_writer(&'a self) -> ConsoleLine {
        ConsoleLine {
            progress: self.0.clone(),
            buf: Vec::new(),
        }
    }
}

struct ConsoleLine {
    progress: Progress,
    buf: Vec<u8>,
}

impl Write for ConsoleLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ConsoleLine {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.progress.suspend(|| {
            let _ = std::io::stderr().write_all(&buf);
        });
    }
}

/// Console lines: `  [stage] message`, with the level when it is not INFO. No colours, no
/// timestamps: the lines sit between the progress display's own lines.
struct ConsoleFormat;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for ConsoleFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "  ")?;
        let level = *event.metadata().level();
        if level != tracing::Level::INFO {
            write!(writer, "{}: ", level.as_str().to_lowercase())?;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(name) = span.extensions().get::<StageName>() {
                    write!(writer, "[{}] ", name.0)?;
                }
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// The stage name recorded on a `stage` span.
struct StageName(String);

struct StageFileLayer;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for StageFileLayer {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        if attrs.metadata().name() != "stage" {
            return;
        }
        let mut v = FieldText::default();
        attrs.record(&mut v);
        if let (Some(name), Some(span)) = (v.name, ctx.span(id)) {
            span.extensions_mut().insert(StageName(name));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(stage) = scope
            .into_iter()
            .find_map(|s| s.extensions().get::<StageName>().map(|n| n.0.clone()))
        else {
            return;
        };
        let Some(log) = open_logs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&stage)
            .cloned()
        else {
            return;
        };
        let mut v = FieldText::default();
        event.record(&mut v);
        let secs = crate::store::now_ms() as f64 / 1000.0;
        log.line(&format!(
            "[{secs:.3}] {:>5} {}",
            event.metadata().level(),
            v.text
        ));
    }
}

#[derive(Default)]
struct FieldText {
    name: Option<String>,
    text: String,
}

impl Visit for FieldText {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.name = Some(value.to_string());
        }
        self.record_debug(field, &value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        } else {
            if field.name() == "name" && self.name.is_none() {
                self.name = Some(format!("{value:?}").trim_matches('"').to_string());
            }
            let _ = write!(self.text, " {}={value:?}", field.name());
        }
    }
}
