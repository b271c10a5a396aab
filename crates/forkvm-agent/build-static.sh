#!/usr/bin/env bash
# Builds forkvm-agent as a statically linked binary for the guest and prints its path.
# --target keeps the crt-static flag away from build scripts and proc macros, which
# must stay dynamically linked host binaries.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build -p forkvm-agent --release --target "$target" "$@" >&2
bin="${CARGO_TARGET_DIR:-$PWD/target}/$target/release/forkvm-agent"
if command -v file >/dev/null && ! file "$bin" | grep -q 'statically linked\|static-pie linked'; then
  echo "error: $bin is not statically linked: $(file "$bin")" >&2
  exit 1
fi
echo "$bin"
