//! forkvm's virtual machine monitor, as a library.
//!
//! One process runs one VM: [`builder::boot`] or [`builder::restore`] builds a [`Vmm`],
//! whose vCPU threads run the guest while the process serves a per-VM control socket
//! ([`control`]). [`zygote`] restores many children from one snapshot, doing the
//! per-snapshot work once. No HTTP and no CLI parsing live here.

pub mod arch;
pub mod builder;
pub mod cold_boot;
pub mod control;
pub mod devices;
pub mod host;
pub mod persist;
pub mod phase_timer;
pub mod unknown_name;
pub mod vmm;
pub mod vstate;
pub mod zygote;

pub use builder::{
    boot, prepare, prepare_lazy, prepare_with_memory, restore, restore_lazy, BootConfig, BuildError, Payload,
    PreparedSnapshot,
};
pub use vmm::{Vmm, VmmError};
