use super::*;
use std::fs;

use crate::data::TokenSource;
use std::path::Path;

/// A writer for raw index contents, so tests can build datasets zflow would never write
/// (several sequences per document, inconsistent indices).
fn write_raw(prefix: &Path, code: u8, lengths: &[i32], doc_indices: &[i64], bin: &[u8]) {
    let mut idx = Vec::new();
    idx.extend_from_slice(MAGIC);
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(code);
    idx.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(doc_indices.len() as u64).to_le_bytes());
    let size = DType::from_code(code).unwrap().size() as i64;
    let mut pointer = 0i64;
    let mut pointers = Vec::new();
    for l in lengths {
        idx.extend_from_slice(&l.to_le_bytes());
        pointers.push(pointer);
        pointer += i64::from(*l) * size;
    }
    for p in pointers {
        idx.extend_from_slice(&p.to_le_bytes());
    }
    for d in doc_indices {
        idx.extend_from_slice(&d.to_le_bytes());
    }
    fs::write(idx_path(prefix), idx).unwrap();
    fs::write(bin_path(prefix), bin).unwrap();
}

fn write(prefix: &Path, dtype: DType, docs: &[Vec<u32>]) -> WriteSummary {
    let mut writer = IndexedDatasetWriter::create(prefix, dtype).unwrap();
    for doc in docs {
        writer.add_document(doc).unwrap();
    }
    writer.finish().unwrap()
}

fn read_all(dataset: &IndexedDataset) -> Vec<Vec<u32>> {
    (0..dataset.num_sequences())
        .map(|s| dataset.sequence(s).unwrap())
        .collect()
}

#[test]
fn max_token_id_reads_every_block() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    let mut big: Vec<u32> = (0..3_000_000).map(|i| i % 1000).collect();
    big[2_500_000] = 60_000;
    write(&prefix, DType::U16, &[vec![5, 7], big]);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.max_token_id().unwrap(), Some(60_000));
    write(&prefix, DType::U16, &[]);
    let empty = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(empty.max_token_id().unwrap(), None);
}

fn open_err(prefix: &Path) -> String {
    format!("{:#}", IndexedDataset::open(prefix).unwrap_err())
}

/// Writes, reopens and compares `docs`, checking the index and the summary too.
fn round_trip(dtype: DType, docs: &[Vec<u32>]) {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("data.v1"); // a dot in the prefix must survive
    let summary = write(&prefix, dtype, docs);
    let tokens: usize = docs.iter().map(Vec::len).sum();
    assert_eq!(summary.docs, docs.len() as u64);
    assert_eq!(summary.tokens, tokens as u64);
    assert_eq!(
        summary.bin_bytes,
        fs::metadata(bin_path(&prefix)).unwrap().len()
    );
    assert_eq!(
        summary.idx_bytes,
        fs::metadata(idx_path(&prefix)).unwrap().len()
    );

    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.dtype(), dtype);
    assert_eq!(dataset.num_sequences(), docs.len());
    assert_eq!(dataset.num_documents(), docs.len());
    assert_eq!(
        dataset.document_indices(),
        (0..=docs.len()).collect::<Vec<_>>()
    );
    assert_eq!(dataset.total_tokens(), tokens as u64);
    assert_eq!(read_all(&dataset), docs);
    // Only the final pair is left behind.
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["data.v1.bin", "data.v1.idx"]);
}

#[test]
fn dtype_codes_match_megatron() {
    let codes: Vec<u8> = DType::ALL.iter().map(|d| d.code()).collect();
    assert_eq!(codes, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(DType::F64.code(), 6);
    assert_eq!(DType::F32.code(), 7);
    for dtype in DType::ALL {
        assert_eq!(DType::from_code(dtype.code()), Some(dtype));
    }
    assert_eq!(DType::from_code(0), None);
    assert_eq!(DType::from_code(9), None);
    assert_eq!(DType::U16.size(), 2);
    assert_eq!(DType::I64.size(), 8);
}

#[test]
fn for_vocab_follows_megatron_cutoff() {
    assert_eq!(DType::for_vocab(50_257), DType::U16);
    assert_eq!(DType::for_vocab(65_499), DType::U16);
    assert_eq!(DType::for_vocab(65_500), DType::I32);
    assert_eq!(DType::for_vocab(151_936), DType::I32);
}

#[test]
fn round_trip_u16() {
    round_trip(
        DType::U16,
        &[vec![1, 2, 3], vec![], vec![65_535, 0], vec![7]],
    );
}

#[test]
fn round_trip_i32() {
    round_trip(
        DType::I32,
        &[vec![200_000, 0, i32::MAX as u32], vec![5; 1000], vec![]],
    );
}

#[test]
fn round_trip_every_integer_dtype_at_its_max() {
    for dtype in DType::ALL.into_iter().filter(|d| !d.is_float()) {
        let max = dtype.max_token().unwrap();
        round_trip(dtype, &[vec![0, 1, max], vec![max / 2]]);
    }
}

#[test]
fn empty_dataset_round_trips() {
    round_trip(DType::U16, &[]);
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("empty");
    write(&prefix, DType::I32, &[]);
    // Header plus a document index holding just 0.
    assert_eq!(fs::metadata(idx_path(&prefix)).unwrap().len(), 34 + 8);
    assert_eq!(fs::metadata(bin_path(&prefix)).unwrap().len(), 0);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.num_docs(), 0);
    assert_eq!(dataset.document_indices(), [0]);
    assert_eq!(dataset.total_tokens(), 0);
}

#[test]
fn index_bytes_are_megatron_layout() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1, 2], vec![3]]);
    let mut expected = Vec::new();
    expected.extend_from_slice(b"MMIDIDX\0\0");
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.push(8);
    expected.extend_from_slice(&2u64.to_le_bytes());
    expected.extend_from_slice(&3u64.to_le_bytes());
    for l in [2i32, 1] {
        expected.extend_from_slice(&l.to_le_bytes());
    }
    for v in [0i64, 4, 0, 1, 2] {
        expected.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(fs::read(idx_path(&prefix)).unwrap(), expected);
    assert_eq!(fs::read(bin_path(&prefix)).unwrap(), [1, 0, 2, 0, 3, 0]);
}

#[test]
fn token_source_reads_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![10, 11, 12, 13], vec![20]]);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.num_docs(), 2);
    assert_eq!(dataset.doc_len(0), 4);
    let mut out = [0; 2];
    dataset.read(0, 1, &mut out).unwrap();
    assert_eq!(out, [11, 12]);
    dataset.read(1, 0, &mut out[..1]).unwrap();
    assert_eq!(out[0], 20);
    dataset.read(0, 4, &mut []).unwrap();
}

#[test]
#[should_panic(expected = "out of range")]
fn token_source_panics_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1, 2]]);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    let _ = dataset.read(0, 1, &mut [0; 2]);
}

#[test]
fn token_too_large_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    let mut writer = IndexedDatasetWriter::create(&prefix, DType::U16).unwrap();
    writer.add_document(&[1, 2]).unwrap();
    let err = format!("{:#}", writer.add_document(&[3, 70_000]).unwrap_err());
    assert!(err.contains("70000") && err.contains("u16"), "{err}");
    assert!(err.contains("position 1 of document 1"), "{err}");
    // The writer is unchanged and still usable.
    writer.add_document(&[4]).unwrap();
    let summary = writer.finish().unwrap();
    assert_eq!((summary.docs, summary.tokens), (2, 3));
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(read_all(&dataset), [vec![1, 2], vec![4]]);
}

#[test]
fn float_dtypes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    let err = IndexedDatasetWriter::create(&prefix, DType::F32).unwrap_err();
    assert!(err.to_string().contains("f32"), "{err}");
    write_raw(&prefix, 7, &[1], &[0, 1], &[0; 4]);
    let err = open_err(&prefix);
    assert!(err.contains("dtype f32 (code 7)"), "{err}");
}

#[test]
fn unfinished_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    let mut writer = IndexedDatasetWriter::create(&prefix, DType::U16).unwrap();
    writer.add_document(&[1, 2, 3]).unwrap();
    drop(writer);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn finish_replaces_an_existing_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1], vec![2]]);
    write(&prefix, DType::I32, &[vec![100_000]]);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.dtype(), DType::I32);
    assert_eq!(read_all(&dataset), [vec![100_000]]);
}

#[test]
fn several_sequences_per_document() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("multi");
    // Document 0 = sequences 0, 1; document 1 = sequences 2, 3 (one empty); document 2 = 4.
    let lengths = [2, 3, 0, 1, 2];
    let tokens: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let bin: Vec<u8> = tokens
        .iter()
        .flat_map(|t| (*t as i32).to_le_bytes())
        .collect();
    write_raw(&prefix, 4, &lengths, &[0, 2, 4, 5], &bin);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(dataset.dtype(), DType::I32);
    assert_eq!(dataset.num_sequences(), 5);
    assert_eq!(dataset.num_documents(), 3);
    assert_eq!(dataset.document_indices(), [0, 2, 4, 5]);
    assert_eq!(dataset.total_tokens(), 8);
    assert_eq!(
        read_all(&dataset),
        [vec![1, 2], vec![3, 4, 5], vec![], vec![6], vec![7, 8]]
    );
    // The TokenSource sees sequences.
    assert_eq!(dataset.num_docs(), 5);
    assert_eq!(dataset.doc_len(1), 3);
}

#[test]
fn multimodal_mode_bytes_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1], vec![2, 3]]);
    let mut idx = fs::read(idx_path(&prefix)).unwrap();
    idx.extend_from_slice(&[0, 1]);
    fs::write(idx_path(&prefix), idx).unwrap();
    let dataset = IndexedDataset::open(&prefix).unwrap();
    assert_eq!(read_all(&dataset), [vec![1], vec![2, 3]]);
}

#[test]
fn negative_tokens_are_an_error_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write_raw(&prefix, 3, &[2], &[0, 1], &[5, 0, 0xff, 0xff]);
    let dataset = IndexedDataset::open(&prefix).unwrap();
    let err = format!("{:#}", dataset.sequence(0).unwrap_err());
    assert!(err.contains("holds -1") && err.contains("d.bin"), "{err}");
}

/// Writes a valid two-document dataset, applies `corrupt` to the raw `.idx` bytes and
/// returns the open error.
fn open_corrupted(corrupt: impl FnOnce(&mut Vec<u8>)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1, 2], vec![3]]);
    let mut idx = fs::read(idx_path(&prefix)).unwrap();
    corrupt(&mut idx);
    fs::write(idx_path(&prefix), idx).unwrap();
    open_err(&prefix)
}

#[test]
fn bad_magic() {
    let err = open_corrupted(|idx| idx[0] = b'X');
    assert!(err.contains("d.idx") && err.contains("bad magic"), "{err}");
}

#[test]
fn unsupported_version() {
    let err = open_corrupted(|idx| idx[9] = 2);
    assert!(
        err.contains("d.idx") && err.contains("unsupported version 2"),
        "{err}"
    );
}

#[test]
fn unknown_dtype_code() {
    let err = open_corrupted(|idx| idx[17] = 9);
    assert!(err.contains("unknown dtype code 9"), "{err}");
}

#[test]
fn truncated_idx() {
    let err = open_corrupted(|idx| idx.truncate(idx.len() - 3));
    assert!(err.contains("d.idx") && err.contains("truncated"), "{err}");
    let err = open_corrupted(|idx| idx.truncate(20));
    assert!(err.contains("d.idx") && err.contains("header"), "{err}");
    // A sequence count far beyond the file (the sum must not overflow either).
    let err = open_corrupted(|idx| idx[18..26].copy_from_slice(&u64::MAX.to_le_bytes()));
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn trailing_bytes_in_idx() {
    let err = open_corrupted(|idx| idx.extend_from_slice(&[0; 5]));
    assert!(err.contains("d.idx") && err.contains("more than"), "{err}");
}

#[test]
fn inconsistent_document_index() {
    // The last document-index entry (bytes -8..) must equal the sequence count.
    let err = open_corrupted(|idx| {
        let at = idx.len() - 8;
        idx[at..].copy_from_slice(&5i64.to_le_bytes());
    });
    assert!(err.contains("ends at sequence 5"), "{err}");
    // The first entry must be 0.
    let err = open_corrupted(|idx| {
        let at = idx.len() - 24;
        idx[at..at + 8].copy_from_slice(&1i64.to_le_bytes());
    });
    assert!(err.contains("starts at 1"), "{err}");
}

#[test]
fn inconsistent_pointers_and_lengths() {
    // Second sequence's pointer: header, two lengths, first pointer.
    let err = open_corrupted(|idx| {
        let at = HEADER_LEN + 8 + 8;
        idx[at..at + 8].copy_from_slice(&2i64.to_le_bytes());
    });
    assert!(err.contains("sequence 1 starts at byte 2"), "{err}");
    let err = open_corrupted(|idx| {
        idx[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(-1i32).to_le_bytes());
    });
    assert!(err.contains("sequence 0 has length -1"), "{err}");
}

#[test]
fn truncated_or_foreign_bin() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("d");
    write(&prefix, DType::U16, &[vec![1, 2], vec![3]]);
    let bin = fs::read(bin_path(&prefix)).unwrap();
    fs::write(bin_path(&prefix), &bin[..5]).unwrap();
    let err = open_err(&prefix);
    assert!(err.contains("d.bin") && err.contains("truncated"), "{err}");
    fs::write(bin_path(&prefix), [bin.as_slice(), &[0, 0]].concat()).unwrap();
    let err = open_err(&prefix);
    assert!(
        err.contains("d.bin") && err.contains("describes only 6"),
        "{err}"
    );
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("nothing");
    let err = open_err(&prefix);
    assert!(err.contains("nothing.idx"), "{err}");
}
