#!/usr/bin/env bash
# Point every alert's runbook_url at another copy of docs/metrics.md (its anchors are the
# alert names in lower case), in the rules and in their unit tests:
#
#   deploy/prometheus/set-runbook-base.sh https://git.example.com/ops/sluice/blob/v1.2/docs/metrics.md
#
# The current base is read from the rules file (every runbook_url shares it), so the
# script can be run again with another base. Check afterwards with deploy/validate.sh or
#   promtool test rules deploy/prometheus/tests/sluice.rules.test.yml
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rules="$here/rules/sluice.rules.yml"
tests="$here/tests/sluice.rules.test.yml"
new="${1:-}"
if [[ ! "$new" =~ ^https?://[^[:space:]\"#]+$ ]]; then
  echo "usage: $0 https://HOST/PATH/metrics.md   (absolute http(s) URL, no fragment)" >&2
  exit 2
fi
mapfile -t bases < <(grep -o 'runbook_url: "[^"#]*#' "$rules" | sed 's/^runbook_url: "//; s/#$//' | sort -u)
if [[ ${#bases[@]} -ne 1 ]]; then
  echo "$rules: expected one runbook base, found ${#bases[@]}: ${bases[*]}" >&2
  exit 1
fi
old="${bases[0]}"
for f in "$rules" "$tests"; do
  # Literal replacement of `runbook_url: "<old>#` (no regex metacharacters involved).
  OLD="runbook_url: \"$old#" NEW="runbook_url: \"$new#" perl -0pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/g' "$f"
done
echo "runbook base: $old -> $new" >&2
