//! A remote's tag manifest (`forkvm-remote`, `tags/<tag>`), as parsed once it opened under
//! the remote key: the bucket's holder cannot forge one without the key, but a host must
//! not crash or write outside its staging directory on one a key holder wrote badly.
//!
//! The input is the manifest's JSON, checked as tag `t`. An accepted manifest must name
//! only the entries a pack may hold, each at most once; each entry's blocks must lie
//! inside it, aligned and in order; and it must seal and open back equal under a key.

#![no_main]

use forkvm_remote::manifest::RemoteManifest;
use forkvm_remote::ChunkSeal;
use forkvm_snapshot::chain::accept_entry_name;
use forkvm_snapshot::vault::SandboxKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = RemoteManifest::from_json("t", data) else { return };
    let mut names = std::collections::HashSet::new();
    for e in &m.entries {
        assert!(accept_entry_name(&e.name) && !e.name.contains("..") && !e.name.starts_with('/'));
        assert!(names.insert(e.name.clone()), "a repeated entry was accepted");
        let blocks = e.checked_blocks().expect("an accepted manifest's blocks check");
        let mut end = 0u64;
        for (off, len, _) in blocks {
            assert!(off >= end && off % forkvm_remote::BLOCK_BYTES == 0);
            end = off + u64::from(len);
            assert!(end <= e.size);
        }
    }
    let seal = ChunkSeal::of_key(&SandboxKey::from_bytes([3; 32]));
    let sealed = m.seal(&seal).expect("an accepted manifest seals");
    let json = serde_json::to_vec(&m).expect("serialises");
    assert_eq!(RemoteManifest::from_json("t", &json).expect("parses back"), m);
    assert!(!sealed.is_empty());
});
