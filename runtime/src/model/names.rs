//! Parameter names: ours and the reference implementation's.

/// The reference implementation's name (Zyphra's `transformers` fork, `ZayaForCausalLM`) of one
/// of our parameters, e.g. `blocks.1.moe.local_experts.3.linear_fc1.weight` ->
/// `model.layers.3.zaya_block.experts.local_experts.3.linear_fc1.weight`. Our blocks pair the
/// reference's layers: attention is layer `2i`, the MoE layer `2i + 1`. Linear weights are
/// stored transposed relative to PyTorch (export transposes them back).
pub fn reference_name(name: &str) -> Option<String> {
    if name == "embed_tokens" {
        return Some("model.embed_tokens.weight".into());
    }
    if let Some(rest) = name.strip_prefix("res_scale.") {
        return Some(format!("model.res_scale.{rest}"));
    }
    if name == "final_norm.weight" {
        return Some("model.final_norm.weight".into());
    }
    let rest = name.strip_prefix("blocks.")?;
    let (block, rest) = rest.split_once('.')?;
    let block: usize = block.parse().ok()?;
    let (attn, moe) = (2 * block, 2 * block + 1);
    let mapped = if let Some(r) = rest.strip_prefix("attn_res_scale.") {
        format!("{attn}.res_scale.{r}")
    } else if let Some(r) = rest.strip_prefix("attn_norm.") {
        format!("{attn}.input_norm.{r}")
    } else if let Some(r) = rest.strip_prefix("self_attn.qkv.") {
        let r = match r {
            "conv0_weight" => "conv_qk.0.weight",
            "conv0_bias" => "conv_qk.0.bias",
            "conv1_weight" => "conv_qk.1.weight",
            "conv1_bias" => "conv_qk.1.bias",
            other => other,
        };
        format!("{attn}.self_attn.qkv.{r}")
    } else if let Some(r) = rest.strip_prefix("self_attn.") {
        format!("{attn}.self_attn.{r}")
    } else if let Some(r) = rest.strip_prefix("moe_res_scale.") {
        format!("{moe}.res_scale.{r}")
    } else if let Some(r) = rest.strip_prefix("moe_norm.") {
        format!("{moe}.input_norm.{r}")
    } else if let Some(r) = rest.strip_prefix("moe.router.router_mlp.") {
        // Our Vec holds the linears only; the reference's Sequential has GELUs at 1 and 3.
        let (k, tail) = r.split_once('.')?;
        format!(
            "{moe}.zaya_block.router.router_mlp.{}.{tail}",
            2 * k.parse::<usize>().ok()?
        )
    } else if let Some(r) = rest.strip_prefix("moe.router.") {
        format!("{moe}.zaya_block.router.{r}")
    } else if let Some(r) = rest.strip_prefix("moe.local_experts.") {
        format!("{moe}.zaya_block.experts.local_experts.{r}")
    } else {
        return None;
    };
    Some(format!("model.layers.{mapped}"))
}
