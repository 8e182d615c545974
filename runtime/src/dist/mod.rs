//! Distribution: how the ranks of one data-parallel launch find each other ([`handshake`],
//! [`collective`]), split the work of a step ([`data_parallel`], [`zero`]) and measure their
//! devices before training ([`preflight`]). The native engine's host TCP ring lives here; a
//! PyTorch worker uses `torch.distributed` instead and shares none of it.

pub mod collective;
pub mod data_parallel;
pub mod handshake;
pub mod preflight;
pub mod zero;
