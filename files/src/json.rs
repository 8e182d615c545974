//! JSON documents: settings layered on settings.

use serde_json::Value;

/// Deep-merges `over` into `base`: mappings merge key by key (recursively), anything else in
/// `over` replaces what `base` has. A phase's `train:` over the recipe's, a task file over the
/// one it includes.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mappings_merge_and_everything_else_is_replaced() {
        let mut base = json!({"a": 1, "m": {"x": 1, "y": [1, 2]}, "l": [1]});
        merge(
            &mut base,
            json!({"m": {"y": [3], "z": null}, "l": {"k": 2}, "n": "new"}),
        );
        assert_eq!(
            base,
            json!({"a": 1, "m": {"x": 1, "y": [3], "z": null}, "l": {"k": 2}, "n": "new"})
        );
    }
}
