//! x86-64 guest entry: memory layout, GDT, identity page tables, CPUID templates, boot
//! MSRs and registers, the MP table, and the Linux boot protocol loader.

pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod linux_boot;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;
