//! Where each stage goes in the drawn graph: columns by depth (a stage sits one column right
//! of its deepest input), and within a column an order that keeps edges short (a few sweeps
//! of the barycenter heuristic, as layered graph drawing does it).

use serde::Serialize;

/// A node's place: its column and its row within the column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Place {
    /// Column (0 = stages with no inputs).
    pub column: usize,
    /// Row within the column (0 = top).
    pub row: usize,
}

/// Places the nodes of a DAG. `inputs[i]` are node `i`'s inputs; `topo` lists every node with
/// each after its inputs. The result is deterministic.
pub fn layout(inputs: &[Vec<usize>], topo: &[usize]) -> Vec<Place> {
    let n = inputs.len();
    let mut column = vec![0usize; n];
    for &i in topo {
        column[i] = inputs[i].iter().map(|&j| column[j] + 1).max().unwrap_or(0);
    }
    let columns = column.iter().max().map_or(0, |c| c + 1);
    let mut outputs = vec![Vec::new(); n];
    for (i, ins) in inputs.iter().enumerate() {
        for &j in ins {
            outputs[j].push(i);
        }
    }
    // Start in topological order; then sweep right (order by the inputs' rows) and left (by
    // the outputs' rows), keeping the current order on ties.
    let mut by_column: Vec<Vec<usize>> = vec![Vec::new(); columns];
    for &i in topo {
        by_column[column[i]].push(i);
    }
    let mut row = vec![0usize; n];
    let renumber = |by_column: &Vec<Vec<usize>>, row: &mut Vec<usize>| {
        for col in by_column {
            for (r, &i) in col.iter().enumerate() {
                row[i] = r;
            }
        }
    };
    renumber(&by_column, &mut row);
    for _ in 0..4 {
        for c in 1..columns {
            sort_by_barycenter(&mut by_column[c], &inputs_rows(inputs, &row));
            renumber(&by_column, &mut row);
        }
        for c in (0..columns.saturating_sub(1)).rev() {
            sort_by_barycenter(&mut by_column[c], &inputs_rows(&outputs, &row));
            renumber(&by_column, &mut row);
        }
    }
    (0..n)
        .map(|i| Place {
            column: column[i],
            row: row[i],
        })
        .collect()
}

/// For each node, the mean row of its neighbours in `adjacent` (`None` without neighbours).
fn inputs_rows(adjacent: &[Vec<usize>], row: &[usize]) -> Vec<Option<f64>> {
    adjacent
        .iter()
        .map(|a| {
            (!a.is_empty()).then(|| a.iter().map(|&j| row[j] as f64).sum::<f64>() / a.len() as f64)
        })
        .collect()
}

/// Orders `col` by barycenter; a node without neighbours keeps its current row as its key.
fn sort_by_barycenter(col: &mut [usize], center: &[Option<f64>]) {
    let mut keyed: Vec<(f64, usize, usize)> = col
        .iter()
        .enumerate()
        .map(|(r, &i)| (center[i].unwrap_or(r as f64), r, i))
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    for (slot, (_, _, i)) in col.iter_mut().zip(keyed) {
        *slot = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_follow_the_deepest_input() {
        // 0 -> 1 -> 2, and 0 -> 2 directly: 2 sits right of 1.
        let inputs = vec![vec![], vec![0], vec![0, 1]];
        let p = layout(&inputs, &[0, 1, 2]);
        assert_eq!(
            p.iter().map(|p| p.column).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn rows_keep_parallel_chains_apart() {
        // Two chains a0 -> a1 and b0 -> b1, listed crosswise: the sweep uncrosses them.
        // Nodes: 0 = a0, 1 = b0, 2 = b1 (input 1), 3 = a1 (input 0).
        let inputs = vec![vec![], vec![], vec![1], vec![0]];
        let p = layout(&inputs, &[0, 1, 2, 3]);
        assert_eq!(p[0].row, p[3].row);
        assert_eq!(p[1].row, p[2].row);
        assert_ne!(p[0].row, p[1].row);
        // Rows in a column are 0..len, each once.
        let mut col1: Vec<usize> = [p[2].row, p[3].row].to_vec();
        col1.sort();
        assert_eq!(col1, vec![0, 1]);
    }
}
