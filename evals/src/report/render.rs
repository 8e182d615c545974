//! Renderers: Markdown, CSV, LaTeX (booktabs) and JSON.
//!
//! Values are shown in percent with one decimal, the standard error as `± x.x` (percent).
//! A missing cell is `—` (Markdown), `---` (LaTeX, an em dash) or empty (CSV). A cell measured
//! with another metric or n-shot than its column header carries that setting, e.g.
//! `40.9 (acc, 10-shot)`. Published rows get a footnote number; the notes under the table list
//! each published row's sources.

use serde_json::{Map, Value, json};

use super::table::{Cell, Column, Table};

fn pct(x: f64) -> String {
    let s = format!("{:.1}", x * 100.0);
    if s == "-0.0" { "0.0".to_string() } else { s }
}

fn setting(metric: &str, n: u32) -> String {
    format!("{metric}, {n}-shot")
}

/// The value of a cell in percent, with `± stderr` (using `pm`) and its differing setting.
fn cell_text(cell: &Cell, column: &Column, pm: &str) -> String {
    let mut s = pct(cell.value);
    if let Some(e) = cell.stderr {
        s.push_str(&format!(" {pm} {}", pct(e)));
    }
    if cell.differs_from(column) {
        s.push_str(&format!(" ({})", setting(&cell.metric, cell.num_fewshot)));
    }
    s
}

const DIFFERS_NOTE: &str =
    "A value followed by (metric, n-shot) was measured with that setting, not the column's.";

fn md_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('\n', " ")
}

/// Escapes text for LaTeX (outside math mode).
pub fn latex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\textbackslash{}"),
            '&' | '%' | '$' | '#' | '_' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            '<' => out.push_str("\\textless{}"),
            '>' => out.push_str("\\textgreater{}"),
            '|' => out.push_str("\\textbar{}"),
            '\n' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

impl Table {
    /// A GitHub-flavoured Markdown table, then the sources of the published rows.
    pub fn to_markdown(&self) -> String {
        let notes = self.footnotes();
        let mut out = String::from("| Model |");
        for c in &self.columns {
            out.push_str(&format!(
                " {} ({}) |",
                md_escape(&c.task),
                md_escape(&setting(&c.metric, c.num_fewshot))
            ));
        }
        out.push_str("\n| --- |");
        for _ in &self.columns {
            out.push_str(" ---: |");
        }
        out.push('\n');
        for (row, note) in self.rows.iter().zip(&notes) {
            out.push_str(&format!("| {}", md_escape(&row.model)));
            if let Some(n) = note {
                out.push_str(&format!(" [{n}]"));
            }
            out.push_str(" |");
            for (cell, col) in row.cells.iter().zip(&self.columns) {
                let text = cell
                    .as_ref()
                    .map_or("—".to_string(), |c| md_escape(&cell_text(c, col, "±")));
                out.push_str(&format!(" {text} |"));
            }
            out.push('\n');
        }
        let differs = self.has_differing_cells();
        if differs || notes.iter().any(Option::is_some) {
            out.push('\n');
        }
        if differs {
            out.push_str(DIFFERS_NOTE);
            out.push('\n');
        }
        if notes.iter().any(Option::is_some) {
            if differs {
                out.push('\n');
            }
            out.push_str("Sources:\n\n");
            for (row, note) in self.rows.iter().zip(&notes) {
                if let Some(n) = note {
                    out.push_str(&format!(
                        "- [{n}] {}: {}\n",
                        md_escape(&row.model),
                        row.sources.join("; ")
                    ));
                }
            }
        }
        out
    }

    /// CSV (RFC 4180): per column a value and a stderr field (percent, one decimal), plus a
    /// setting field for columns where some row was measured differently; then the row's
    /// sources. Missing values are empty.
    pub fn to_csv(&self) -> String {
        let with_setting: Vec<bool> = (0..self.columns.len())
            .map(|j| {
                self.rows.iter().any(|r| {
                    r.cells[j]
                        .as_ref()
                        .is_some_and(|c| c.differs_from(&self.columns[j]))
                })
            })
            .collect();
        let mut header = vec!["model".to_string()];
        for (c, ws) in self.columns.iter().zip(&with_setting) {
            header.push(format!(
                "{} ({})",
                c.task,
                setting(&c.metric, c.num_fewshot)
            ));
            header.push(format!("{} stderr", c.task));
            if *ws {
                header.push(format!("{} setting", c.task));
            }
        }
        header.push("sources".to_string());
        let mut lines = vec![header];
        for row in &self.rows {
            let mut line = vec![row.model.clone()];
            for ((cell, col), ws) in row.cells.iter().zip(&self.columns).zip(&with_setting) {
                line.push(cell.as_ref().map_or(String::new(), |c| pct(c.value)));
                line.push(
                    cell.as_ref()
                        .and_then(|c| c.stderr)
                        .map_or(String::new(), pct),
                );
                if *ws {
                    line.push(
                        cell.as_ref()
                            .filter(|c| c.differs_from(col))
                            .map_or(String::new(), |c| setting(&c.metric, c.num_fewshot)),
                    );
                }
            }
            line.push(row.sources.join(" "));
            lines.push(line);
        }
        let mut out = String::new();
        for line in lines {
            let fields: Vec<String> = line.iter().map(|f| csv_field(f)).collect();
            out.push_str(&fields.join(","));
            out.push_str("\r\n");
        }
        out
    }

    /// A booktabs `tabular` (needs `\usepackage{booktabs}`), then the sources as footnotes.
    pub fn to_latex(&self) -> String {
        let notes = self.footnotes();
        let mut out = format!(
            "\\begin{{tabular}}{{l{}}}\n\\toprule\n",
            "r".repeat(self.columns.len())
        );
        out.push_str("Model");
        for c in &self.columns {
            out.push_str(&format!(" & {}", latex_escape(&c.task)));
        }
        out.push_str(" \\\\\n");
        for c in &self.columns {
            out.push_str(&format!(
                " & {}",
                latex_escape(&setting(&c.metric, c.num_fewshot))
            ));
        }
        out.push_str(" \\\\\n\\midrule\n");
        for (i, (row, note)) in self.rows.iter().zip(&notes).enumerate() {
            if i > 0 && row.published && !self.rows[i - 1].published {
                out.push_str("\\midrule\n");
            }
            out.push_str(&latex_escape(&row.model));
            if let Some(n) = note {
                out.push_str(&format!("\\textsuperscript{{{n}}}"));
            }
            for (cell, col) in row.cells.iter().zip(&self.columns) {
                let text = cell.as_ref().map_or("---".to_string(), |c| {
                    latex_escape(&cell_text(c, col, "\u{0}")).replace('\u{0}', "$\\pm$")
                });
                out.push_str(&format!(" & {text}"));
            }
            out.push_str(" \\\\\n");
        }
        out.push_str("\\bottomrule\n\\end{tabular}\n");
        let mut lines = Vec::new();
        if self.has_differing_cells() {
            lines.push(latex_escape(DIFFERS_NOTE));
        }
        for (row, note) in self.rows.iter().zip(&notes) {
            if let Some(n) = note {
                let urls: Vec<String> = row
                    .sources
                    .iter()
                    .map(|s| format!("\\texttt{{{}}}", latex_escape(s)))
                    .collect();
                lines.push(format!(
                    "\\textsuperscript{{{n}}}{}: {}",
                    latex_escape(&row.model),
                    urls.join("; ")
                ));
            }
        }
        if !lines.is_empty() {
            out.push_str("\n\\par\\smallskip\n{\\footnotesize\n");
            out.push_str(&lines.join("\\\\\n"));
            out.push_str("\\par}\n");
        }
        out
    }

    /// JSON in the spirit of lm-eval's `results.json`: per model, `results` (`"metric,none"`
    /// and `"metric_stderr,none"` as fractions), `versions`, `n-shot`, and when known
    /// `config_hashes`, `sources` and `notes`; plus the columns. Pretty, trailing newline.
    pub fn to_json(&self) -> String {
        let columns: Vec<Value> = self
            .columns
            .iter()
            .map(|c| json!({"task": c.task, "metric": c.metric, "n-shot": c.num_fewshot}))
            .collect();
        let mut models = Map::new();
        for row in &self.rows {
            let mut results = Map::new();
            let mut versions = Map::new();
            let mut shots = Map::new();
            let mut hashes = Map::new();
            let mut sources = Map::new();
            let mut notes = Map::new();
            for (cell, col) in row.cells.iter().zip(&self.columns) {
                let Some(c) = cell else { continue };
                let (metric, filter) = c.metric.split_once(',').unwrap_or((&c.metric, "none"));
                let mut r = Map::new();
                r.insert(format!("{metric},{filter}"), json!(c.value));
                if let Some(e) = c.stderr {
                    r.insert(format!("{metric}_stderr,{filter}"), json!(e));
                }
                results.insert(col.task.clone(), Value::Object(r));
                if let Some(v) = &c.version {
                    versions.insert(col.task.clone(), json!(v));
                }
                shots.insert(col.task.clone(), json!(c.num_fewshot));
                if let Some(h) = &c.config_hash {
                    hashes.insert(col.task.clone(), json!(h));
                }
                if let Some(s) = &c.source {
                    sources.insert(col.task.clone(), json!(s));
                }
                if let Some(n) = &c.note {
                    notes.insert(col.task.clone(), json!(n));
                }
            }
            let mut m = Map::new();
            m.insert("published".into(), json!(row.published));
            m.insert("results".into(), Value::Object(results));
            m.insert("versions".into(), Value::Object(versions));
            m.insert("n-shot".into(), Value::Object(shots));
            for (key, map) in [
                ("config_hashes", hashes),
                ("sources", sources),
                ("notes", notes),
            ] {
                if !map.is_empty() {
                    m.insert(key.into(), Value::Object(map));
                }
            }
            models.insert(row.model.clone(), Value::Object(m));
        }
        let doc = json!({"columns": columns, "models": Value::Object(models)});
        let mut s = serde_json::to_string_pretty(&doc).expect("table serialises");
        s.push('\n');
        s
    }
}
