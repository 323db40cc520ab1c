#!/usr/bin/env bash
# The README's walk-through with curl ("Walk-through with curl"), verbatim:
# run it, with `sandgate dev` running, from the directory where dev was
# started (it writes .sandgate/dev.env there). TestReadmeWalkthrough runs
# this file against a real dev broker; keep README.md's copy identical to
# everything below the set line.
set -euo pipefail

set -a; . .sandgate/dev.env; set +a
sg() { curl -sS --fail-with-body --cacert "$BROKER_CA" -H "Authorization: Bearer $BROKER_TOKEN" "$@"; echo; }

# 1. The lease: what this token may do.
sg "$BROKER_URL/v1/lease"

# 2. Acquire a workspace with no network (the Idempotency-Key makes retries safe).
WS=$(sg -H "Idempotency-Key: walkthrough-$(date +%s%N)" \
  -d '{"label":"demo","egress":{"allowed_domains":[]}}' \
  "$BROKER_URL/v1/workspaces" | sed -E 's/.*"workspace_id":"([^"]+)".*/\1/')
echo "workspace: $WS"

# 3. Run a command (argv, no shell). stdout_b64 "aGkK" is "hi\n".
sg -d '{"argv":["echo","hi"]}' "$BROKER_URL/v1/workspaces/$WS/exec"

# 4. Write a file (parents are created), then read it back.
sg -d '{"path":"/workspace/notes/hello.txt","contents_b64":"aGVsbG8K"}' "$BROKER_URL/v1/workspaces/$WS/files/write"
sg -d '{"path":"/workspace/notes/hello.txt"}' "$BROKER_URL/v1/workspaces/$WS/files/read"

# 5. Release it: state "terminated", reason "released", metered_seconds.
sg -X DELETE "$BROKER_URL/v1/workspaces/$WS"
