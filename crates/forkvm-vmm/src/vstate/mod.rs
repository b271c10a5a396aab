//! KVM-side state: guest memory, the VM (irqchip, PIT, clock), vCPUs and their threads.

pub mod emulation;
pub mod exit;
pub mod irqchip;
pub mod lazy_memory;
pub mod memory;
pub mod memory_playbook;
pub mod uffd;
pub mod vcpu;
pub mod vcpu_state;
pub mod vm;
