//! Checks the Rust Megatron dataset writer and reader against an independent Python
//! implementation (`tests/megatron_format.py`, standard library only), in both directions.
//! Two implementations written separately from the format description agreeing is much
//! stronger evidence of Megatron compatibility than either one round-tripping its own files.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use zflow_runtime::data::TokenSource;
use zflow_runtime::data::megatron::{DType, IndexedDataset, IndexedDatasetWriter};

/// Runs the Python implementation with `args`; returns its stdout, failing on any error.
fn python(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/megatron_format.py");
    let output = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("these tests need python3 on PATH");
    assert!(
        output.status.success(),
        "python3 {} {args:?} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn prefix_str(prefix: &Path) -> &str {
    prefix.to_str().expect("temporary paths are UTF-8")
}

/// Documents with the awkward cases: an empty one, the dtype's largest token, a long one.
fn sample_docs(dtype: DType) -> Vec<Vec<u32>> {
    let max = match dtype {
        DType::U16 => u16::MAX as u32,
        DType::I32 => i32::MAX as u32,
        other => panic!("no sample for {other}"),
    };
    vec![
        vec![1, 2, 3],
        vec![],
        vec![max, 0, 17],
        (0..500).collect(),
        vec![42],
    ]
}

/// What the Python reader must print for a dataset of one sequence per document.
fn expected_json(dtype: DType, docs: &[Vec<u32>]) -> Value {
    let lengths: Vec<usize> = docs.iter().map(Vec::len).collect();
    let pointers: Vec<usize> = lengths
        .iter()
        .scan(0, |offset, len| {
            let pointer = *offset;
            *offset += len * dtype.size();
            Some(pointer)
        })
        .collect();
    json!({
        "dtype_code": dtype.code(),
        "sequence_lengths": lengths,
        "sequence_pointers": pointers,
        "document_indices": (0..=docs.len()).collect::<Vec<_>>(),
        "sequences": docs,
    })
}

fn rust_writes_python_reads(dtype: DType, docs: &[Vec<u32>]) {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("rust");
    let mut writer = IndexedDatasetWriter::create(&prefix, dtype).unwrap();
    for doc in docs {
        writer.add_document(doc).unwrap();
    }
    writer.finish().unwrap();

    let printed: Value = serde_json::from_str(&python(&["read", prefix_str(&prefix)])).unwrap();
    assert_eq!(printed, expected_json(dtype, docs));
}

fn python_writes_rust_reads(dtype: DType, docs: &[Vec<u32>], seqs_per_doc: usize) {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("python");
    let docs_json = serde_json::to_string(docs).unwrap();
    let code = dtype.code().to_string();
    let per_doc = seqs_per_doc.to_string();
    python(&[
        "write",
        prefix_str(&prefix),
        &code,
        &docs_json,
        "--seqs-per-doc",
        &per_doc,
    ]);

    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.dtype(), dtype);
    assert_eq!(dataset.num_documents(), docs.len());
    assert_eq!(dataset.num_sequences(), docs.len() * seqs_per_doc);
    assert_eq!(
        dataset.num_docs(),
        dataset.num_sequences(),
        "TokenSource docs are sequences"
    );
    let total: usize = docs.iter().map(Vec::len).sum();
    assert_eq!(dataset.total_tokens(), total as u64);

    // Sequence by sequence, the Rust reader agrees with the Python reader ...
    let sequences: Vec<Vec<u32>> = (0..dataset.num_sequences())
        .map(|s| dataset.sequence(s).unwrap())
        .collect();
    let printed: Value = serde_json::from_str(&python(&["read", prefix_str(&prefix)])).unwrap();
    assert_eq!(json!(sequences), printed["sequences"]);
    assert_eq!(
        json!(dataset.document_indices()),
        printed["document_indices"]
    );

    // ... and the document index groups the sequences back into the documents written.
    let indices = dataset.document_indices();
    let regrouped: Vec<Vec<u32>> = indices
        .windows(2)
        .map(|w| sequences[w[0]..w[1]].concat())
        .collect();
    assert_eq!(regrouped, docs);

    // The TokenSource view reads the same tokens.
    for (seq, tokens) in sequences.iter().enumerate() {
        let mut out = vec![0; dataset.doc_len(seq)];
        dataset.read(seq, 0, &mut out).unwrap();
        assert_eq!(&out, tokens);
    }
}

#[test]
fn rust_writer_python_reader_u16() {
    rust_writes_python_reads(DType::U16, &sample_docs(DType::U16));
}

#[test]
fn rust_writer_python_reader_i32() {
    rust_writes_python_reads(DType::I32, &sample_docs(DType::I32));
}

#[test]
fn rust_writer_python_reader_empty() {
    rust_writes_python_reads(DType::U16, &[]);
}

#[test]
fn python_writer_rust_reader_u16() {
    python_writes_rust_reads(DType::U16, &sample_docs(DType::U16), 1);
    python_writes_rust_reads(DType::U16, &sample_docs(DType::U16), 2);
}

#[test]
fn python_writer_rust_reader_i32() {
    python_writes_rust_reads(DType::I32, &sample_docs(DType::I32), 1);
    python_writes_rust_reads(DType::I32, &sample_docs(DType::I32), 3);
}

#[test]
fn python_writer_rust_reader_empty() {
    python_writes_rust_reads(DType::I32, &[], 1);
}

#[test]
fn python_rejects_what_rust_rejects() {
    // A sanity check that the Python reader is a real check, not one that accepts anything.
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("bad");
    std::fs::write(dir.path().join("bad.idx"), b"NOTMEGATRON").unwrap();
    std::fs::write(dir.path().join("bad.bin"), b"").unwrap();
    let status = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/megatron_format.py"))
        .args(["read", prefix_str(&prefix)])
        .output()
        .unwrap();
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("bad magic"));
    assert!(IndexedDataset::open(&prefix).is_err());
}
