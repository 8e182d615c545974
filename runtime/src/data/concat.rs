//! Several token sources read as one: a sharded source's shards, in shard order. Document `d`
//! of the whole is document `d - start(p)` of the part `p` whose range holds it (a binary search
//! over the parts' starts, so a lookup costs O(log parts)).

use anyhow::Result;

use super::TokenSource;

/// The concatenation of `parts`' documents, in order.
pub struct Concat<S> {
    parts: Vec<S>,
    /// `starts[p]`: the first document of part `p`; `starts[parts.len()]` is the total.
    starts: Vec<usize>,
}

impl<S: TokenSource> Concat<S> {
    /// The concatenation of `parts`, in order.
    pub fn new(parts: Vec<S>) -> Self {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut total = 0;
        starts.push(0);
        for p in &parts {
            total += p.num_docs();
            starts.push(total);
        }
        Concat { parts, starts }
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[S] {
        &self.parts
    }

    /// (part, document within it) of document `doc`; panics beyond the last document.
    fn locate(&self, doc: usize) -> (usize, usize) {
        assert!(
            doc < self.num_docs(),
            "document {doc} of {}",
            self.num_docs()
        );
        // The last part starting at or before `doc` (empty parts share a start: skip them).
        let part = self.starts.partition_point(|&s| s <= doc) - 1;
        (part, doc - self.starts[part])
    }
}

impl<S: TokenSource> TokenSource for Concat<S> {
    fn num_docs(&self) -> usize {
        *self.starts.last().expect("starts holds the total")
    }

    fn doc_len(&self, doc: usize) -> usize {
        let (p, d) = self.locate(doc);
        self.parts[p].doc_len(d)
    }

    fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        let (p, d) = self.locate(doc);
        self.parts[p].read(d, offset, out)
    }

    fn num_tokens(&self) -> u64 {
        self.parts.iter().map(|p| p.num_tokens()).sum()
    }

    fn part_tokens(&self) -> Vec<u64> {
        self.parts.iter().flat_map(|p| p.part_tokens()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Documents as token lists.
    struct Docs(Vec<Vec<u32>>);

    impl TokenSource for Docs {
        fn num_docs(&self) -> usize {
            self.0.len()
        }
        fn doc_len(&self, doc: usize) -> usize {
            self.0[doc].len()
        }
        fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> Result<()> {
            out.copy_from_slice(&self.0[doc][offset..offset + out.len()]);
            Ok(())
        }
    }

    #[test]
    fn reads_every_part_in_order_and_skips_empty_parts() {
        let c = Concat::new(vec![
            Docs(vec![vec![1, 2], vec![3]]),
            Docs(vec![]),
            Docs(vec![vec![4, 5, 6]]),
            Docs(vec![]),
            Docs(vec![vec![7]]),
        ]);
        assert_eq!(c.num_docs(), 4);
        let docs: Vec<Vec<u32>> = (0..c.num_docs())
            .map(|d| {
                let mut out = vec![0; c.doc_len(d)];
                c.read(d, 0, &mut out).unwrap();
                out
            })
            .collect();
        assert_eq!(docs, vec![vec![1, 2], vec![3], vec![4, 5, 6], vec![7]]);
        let mut tail = [0; 2];
        c.read(2, 1, &mut tail).unwrap();
        assert_eq!(tail, [5, 6]);
    }
}
