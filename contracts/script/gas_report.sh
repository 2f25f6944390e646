#!/usr/bin/env bash
# Gas per call of one worker lease (8 completions x 8 tasks, a 3-member committee deciding on 2 votes)
# and per accepted sample.
# Invariant: the numbers come from test/GasPath.t.sol, one transaction per step (see its header);
# the summary sums the `tx <step>` lines: claim + drawSeed + submit + 2 votes + finalize + withdrawPayment.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export FOUNDRY_SOLC="${FOUNDRY_SOLC:-$here/../tools/solc}"
export FOUNDRY_OFFLINE=true
FORGE="${FORGE:-$here/../node_modules/@foundry-rs/forge-linux-amd64/bin/forge}"
[ -x "$FORGE" ] || FORGE="$(command -v forge)"

# --gas-report makes forge run each top-level call as its own transaction (isolation), so the tests'
# numbers are measured, not estimated.
if ! out="$("$FORGE" test --match-contract GasPath --gas-report -vv 2>&1)"; then
  printf '%s\n' "$out"
  exit 1
fi

echo "== forge gas report (all calls made by the GasPath tests, setUp included) =="
printf '%s\n' "$out" | awk '/^╭/{p=1} p{print} /^╰/{p=0}'
echo
echo "== per call, one transaction each (21000 + calldata + execution - refund) =="
printf "%s\n" "$out" | grep -E "^\s+tx " | sed "s/^ *//"
echo
printf '%s\n' "$out" | awk -v samples=64 '
  /^ +tx claim:/            { c=$NF }
  /^ +tx drawSeed:/         { d=$NF }
  /^ +tx submit:/           { s=$NF }
  /^ +tx vote \(first\):/    { a1=$NF }
  /^ +tx vote \(deciding\):/ { a2=$NF }
  /^ +tx finalize:/         { f=$NF }
  /^ +tx withdrawPayment:/  { w=$NF }
  END {
    if (c == "" || d == "" || s == "" || a1 == "" || a2 == "" || f == "" || w == "") { print "missing a measurement" > "/dev/stderr"; exit 1 }
    total = c + d + s + a1 + a2 + f + w
    printf "== one accepted lease (round 0 decided by 2 of 3 committee members) ==\n"
    printf "claim %d + drawSeed %d + submit %d + vote %d + vote %d + finalize %d + withdrawPayment %d = %d gas\n", c, d, s, a1, a2, f, w, total
    printf "per accepted sample (/%d): %d gas\n", samples, total / samples
  }'
