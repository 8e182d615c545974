//! The stage graph: nodes are stages, an edge a -> b means b reads a's output.

use std::collections::{BTreeSet, HashMap};

use anyhow::{Result, bail};
use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::Dfs;

use crate::recipe::{Recipe, StageNode};

/// A recipe's stages as a DAG, with a topological order.
pub struct StageGraph {
    graph: DiGraph<usize, ()>,
    index: HashMap<String, NodeIndex>,
    nodes: Vec<StageNode>,
    order: Vec<usize>,
}

impl StageGraph {
    /// Builds the graph; fails naming the stages of a cycle if there is one.
    pub fn new(recipe: &Recipe) -> Result<StageGraph> {
        let nodes = recipe.nodes.clone();
        let mut graph = DiGraph::with_capacity(nodes.len(), nodes.len() * 2);
        let mut index = HashMap::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            index.insert(n.name.clone(), graph.add_node(i));
        }
        for n in &nodes {
            for need in &n.needs {
                let (Some(&from), Some(&to)) = (index.get(need), index.get(&n.name)) else {
                    bail!("stage `{}` needs unknown stage `{need}`", n.name);
                };
                graph.update_edge(from, to, ());
            }
        }
        let order = kahn_order(&graph);
        if order.len() < nodes.len() {
            let scc = petgraph::algo::tarjan_scc(&graph)
                .into_iter()
                .find(|c| c.len() > 1 || graph.contains_edge(c[0], c[0]))
                .expect("a graph with no topological order has a cycle");
            let first = *scc.iter().min().expect("an SCC is not empty");
            let names = describe_cycle(&graph, &nodes, first);
            bail!("the stages form a cycle: {names}");
        }
        Ok(StageGraph {
            graph,
            index,
            nodes,
            order,
        })
    }

    /// All nodes, in recipe order.
    pub fn nodes(&self) -> &[StageNode] {
        &self.nodes
    }

    /// Node indices (into [`Self::nodes`]) in an order where inputs come first. Among stages
    /// free to go in any order, recipe order is kept.
    pub fn topo_order(&self) -> &[usize] {
        &self.order
    }

    /// Index of the node named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|ix| self.graph[*ix])
    }

    /// `name` and everything it depends on, transitively.
    pub fn ancestors(&self, name: &str) -> BTreeSet<usize> {
        self.reach(name, Direction::Incoming)
    }

    /// `name` and everything that depends on it, transitively.
    pub fn descendants(&self, name: &str) -> BTreeSet<usize> {
        self.reach(name, Direction::Outgoing)
    }

    fn reach(&self, name: &str, dir: Direction) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        let Some(&start) = self.index.get(name) else {
            return out;
        };
        let reversed = petgraph::visit::Reversed(&self.graph);
        if dir == Direction::Outgoing {
            let mut dfs = Dfs::new(&self.graph, start);
            while let Some(ix) = dfs.next(&self.graph) {
                out.insert(self.graph[ix]);
            }
        } else {
            let mut dfs = Dfs::new(reversed, start);
            while let Some(ix) = dfs.next(reversed) {
                out.insert(self.graph[ix]);
            }
        }
        out
    }

    /// Input node indices of node `i`, in `needs` order.
    pub fn inputs_of(&self, i: usize) -> Vec<usize> {
        self.nodes[i]
            .needs
            .iter()
            .filter_map(|n| self.position(n))
            .collect()
    }

    /// The graph in Graphviz dot.
    pub fn to_dot(&self, label: impl Fn(&StageNode) -> String) -> String {
        let mut out =
            String::from("digraph zflow {\n  rankdir=LR;\n  node [shape=box, style=rounded];\n");
        for n in &self.nodes {
            out.push_str(&format!(
                "  \"{}\" [label=\"{}\"];\n",
                n.name,
                label(n).replace('"', "\\\"")
            ));
        }
        for n in &self.nodes {
            for need in &n.needs {
                out.push_str(&format!("  \"{need}\" -> \"{}\";\n", n.name));
            }
        }
        out.push_str("}\n");
        out
    }

    /// The graph as a Mermaid flowchart.
    pub fn to_mermaid(&self, label: impl Fn(&StageNode) -> String) -> String {
        let id: HashMap<&str, String> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), format!("s{i}")))
            .collect();
        let mut out = String::from("flowchart LR\n");
        for n in &self.nodes {
            out.push_str(&format!(
                "  {}[\"{}\"]\n",
                id[n.name.as_str()],
                label(n).replace('"', "'")
            ));
        }
        for n in &self.nodes {
            for need in &n.needs {
                out.push_str(&format!(
                    "  {} --> {}\n",
                    id[need.as_str()],
                    id[n.name.as_str()]
                ));
            }
        }
        out
    }
}

/// Kahn's algorithm, taking ready stages in recipe order so the order is stable and readable.
fn kahn_order(graph: &DiGraph<usize, ()>) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut indegree: Vec<usize> = graph
        .node_indices()
        .map(|ix| graph.neighbors_directed(ix, Direction::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = graph
        .node_indices()
        .filter(|ix| indegree[ix.index()] == 0)
        .map(|ix| Reverse(ix.index()))
        .collect();
    let mut order = Vec::with_capacity(indegree.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(graph[NodeIndex::new(i)]);
        for next in graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            indegree[next.index()] -= 1;
            if indegree[next.index()] == 0 {
                ready.push(Reverse(next.index()));
            }
        }
    }
    order
}

/// Names the stages on a cycle through `start`, as `a -> b -> a`.
fn describe_cycle(graph: &DiGraph<usize, ()>, nodes: &[StageNode], start: NodeIndex) -> String {
    // Depth-first search from `start` for a path back to it.
    let mut stack = vec![(start, vec![start])];
    let mut seen = BTreeSet::new();
    while let Some((ix, path)) = stack.pop() {
        for next in graph.neighbors_directed(ix, Direction::Outgoing) {
            if next == start {
                let mut names: Vec<&str> = path
                    .iter()
                    .map(|p| nodes[graph[*p]].name.as_str())
                    .collect();
                names.push(&nodes[graph[start]].name);
                return names.join(" -> ");
            }
            if seen.insert(next) {
                let mut p = path.clone();
                p.push(next);
                stack.push((next, p));
            }
        }
    }
    nodes[graph[start]].name.clone()
}
