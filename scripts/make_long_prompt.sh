#!/usr/bin/env bash
# Writes a long public-domain prompt (King James Bible text, from the Debian package bible-kjv) with one
# fact planted deep inside it, followed by a question about that fact.
#   scripts/make_long_prompt.sh OUT_FILE [WORDS] [DEPTH_PERCENT]
# WORDS (default 3000) is the haystack size in words (about 1.3 tokens a word for SmolLM2's tokenizer);
# DEPTH_PERCENT (default 40) is where the fact goes.
set -euo pipefail
out=${1:?usage: make_long_prompt.sh OUT_FILE [WORDS] [DEPTH_PERCENT]}
words=${2:-3000}
depth=${3:-40}
command -v bible >/dev/null || { echo "make_long_prompt: the 'bible' command is missing: run scripts/setup.sh" >&2; exit 1; }
hay=$(bible "Genesis1:1-50:26" | grep -v '^\s*$' | sed -E 's/^ *[0-9]+ //' | tr '\n' ' ' | tr -s ' ')
total=$(wc -w <<<"$hay")
(( words <= total )) || { echo "make_long_prompt: at most $total words available" >&2; exit 1; }
at=$(( words * depth / 100 ))
fact="Remember this carefully: the secret code of the old lighthouse keeper is 4817."
{
  echo "Read the following text. Somewhere in it there is a secret code."
  echo
  awk -v n="$words" -v at="$at" -v fact="$fact" '{ for (i = 1; i <= n && i <= NF; ++i) { if (i == at) printf "\n%s\n", fact; printf "%s ", $i } }' <<<"$hay"
  echo
  echo
  echo "Question: What is the secret code of the old lighthouse keeper? Answer with the number only."
} > "$out"
echo "make_long_prompt: wrote $out ($words words, fact at ${depth}%)" >&2
