#!/bin/sh
# Regenerate the generated reference under docs/reference/ from the code (settings table,
# flags' help, the served OpenAPI document). crates/runcell/tests/docs.rs fails when the
# committed files differ from what this writes.
set -eu
cd "$(dirname "$0")/.."
cargo build -q -p runcell
bin=target/debug/runcell
"$bin" __reference settings > docs/reference/settings.md
"$bin" __reference openapi > docs/reference/openapi.json
echo "docs/reference/settings.md and docs/reference/openapi.json regenerated"
