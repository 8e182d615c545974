//! The launch of a data-parallel group: where each rank is ([`placement`]), the secret every
//! rank proves ([`secret`]), and the device probes of the preflight stage ([`preflight`]).
//! The ranks' collectives are `torch.distributed`'s.

pub mod placement;
pub mod preflight;
pub mod secret;
